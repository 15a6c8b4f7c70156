"""Float32 division and square roots in generated Triton code round as eager's CUDA kernels do.

On the GPU Triton's `/` is div.full.f32 (up to 2 ulp) and tl.sqrt / tl.rsqrt are the .approx.ftz
instructions, where eager divides and takes roots correctly rounded: the H100 fuzzer found
uint8 / (|uint8| + 1) one ulp off eager. Checked here on the CPU: Triton compiles for sm_90 without
a GPU, and the PTX tells which instruction each spelling becomes."""
import glob

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra import libdevice

pytestmark = pytest.mark.smelt_only


@triton.jit
def _spellings(a, b, out, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(a + i)
    y = tl.load(b + i)
    # the spellings of smelt/codegen/triton/ops.py: FLOAT32_DIV, FLOAT32_UNARY, rsqrt
    tl.store(out + i, tl.div_rn(x, y) + tl.sqrt_rn(x) + tl.div_rn(1.0, x) + libdevice.rsqrt(y))


def test_float32_spellings_compile_to_correctly_rounded_instructions():
    src = ASTSource(_spellings, {"a": "*fp32", "b": "*fp32", "out": "*fp32", "N": "constexpr"}, constexprs={"N": 128})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx
    for approximate in ("div.full", "div.approx", "\tsqrt.approx"):  # rsqrt.approx is eager's rsqrtf too
        assert approximate not in ptx, approximate


@pytest.mark.parametrize("fn", [
    lambda x, y: x / y, lambda x, y: x.sqrt() + y, lambda x, y: torch.sigmoid(x) * y,
    lambda x, y: x.reciprocal() - y, lambda x, y: torch.div(x, y, rounding_mode="floor"),
    lambda x, y: torch.remainder(x, y), lambda x, y: x.to(torch.uint8) / (y.abs() + 1),
], ids=["div", "sqrt", "sigmoid", "reciprocal", "floor_div", "remainder", "uint8_div"])
def test_generated_kernels_divide_without_tritons_approximate_slash(fn, tmp_path, monkeypatch):
    from smelt.config import SETTINGS  # noqa: F401  (the debug dir is read per compile)
    monkeypatch.setenv("SMELT_CPU_BACKEND", "triton")
    monkeypatch.setenv("SMELT_DEBUG_DIR", str(tmp_path))
    torch._dynamo.reset()
    x, y = torch.rand(64) + 0.5, torch.rand(64) + 0.5
    torch.testing.assert_close(torch.compile(fn, backend="smelt")(x, y), fn(x, y))
    sources = [open(p).read() for p in glob.glob(str(tmp_path / "**" / "triton_*.py"), recursive=True)]
    assert sources
    body = "\n".join(line for s in sources for line in s.splitlines() if line.startswith("    tmp"))
    assert " / " not in body and "tl.sqrt(" not in body and "tl.rsqrt(" not in body, body


def _kernel_body(fn, args, tmp_path, monkeypatch, **tolerance) -> str:
    """The `tmp` lines of the Triton kernels smelt generates for fn, after checking its values."""
    monkeypatch.setenv("SMELT_CPU_BACKEND", "triton")
    monkeypatch.setenv("SMELT_DEBUG_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="smelt")(*args), fn(*args), **tolerance)
    sources = [open(p).read() for p in glob.glob(str(tmp_path / "**" / "triton_*.py"), recursive=True)]
    assert sources
    return "\n".join(line for s in sources for line in s.splitlines() if line.startswith("    tmp"))


def _batch_norm_silu(x, y):
    mean, var = y[:8].float().bfloat16(), (y[8:16].abs() + 0.5)
    return F.silu(F.batch_norm(x, mean, var, y[:8], y[8:16], training=False))


@pytest.mark.parametrize("fn", [
    lambda x, y: x / y, lambda x, y: (x.float().sqrt() * 2).bfloat16(), lambda x, y: torch.sigmoid(x) * y,
    lambda x, y: x.reciprocal() - y, lambda x, y: F.silu(x) + y, lambda x, y: F.hardswish(x) * y,
    lambda x, y: F.hardsigmoid(x) * y, lambda x, y: torch.softmax(x, -1), _batch_norm_silu,
], ids=["div", "sqrt_of_float", "sigmoid", "reciprocal", "silu", "hardswish", "hardsigmoid", "softmax",
        "batch_norm_silu"])
def test_values_rounded_to_bfloat16_divide_with_tritons_slash(fn, tmp_path, monkeypatch):
    """A float32 quotient or root eager rounds to bfloat16 before any use takes div.full / sqrt.approx
    on the GPU (lowering/half_rounding.py): within a few float32 ulps, far under bfloat16's rounding."""
    x, y = (torch.rand(16, 8, 4, 4) + 0.5).bfloat16(), (torch.rand(16, 8, 4, 4) + 0.5).bfloat16()
    if fn is _batch_norm_silu:
        x, y = torch.randn(4, 8, 5, 5).bfloat16(), torch.randn(16).bfloat16()
    body = _kernel_body(fn, (x, y), tmp_path, monkeypatch)
    assert "div_rn" not in body and "sqrt_rn" not in body, body
    assert " / " in body or "libdevice.sqrt(" in body, body


@pytest.mark.parametrize("fn", [
    lambda x, y: x.float() / y.float(), lambda x, y: (x.float() / y.float()).floor().bfloat16(),
    lambda x, y: (x.float() / y.float()).sum().bfloat16(),
    lambda x, y: torch.where(x.float() / y.float() > 1, x, y),
    lambda x, y: (lambda q: (q.bfloat16(), q))(x.float() / y.float()),
], ids=["returned", "floored", "summed", "compared", "also_returned"])
def test_float32_values_read_before_rounding_stay_correctly_rounded(fn, tmp_path, monkeypatch):
    """The same quotient with a float32 reader (the caller, a floor, a sum that may cancel, a
    comparison) keeps eager's correctly rounded division."""
    x, y = (torch.rand(64) + 0.5).bfloat16(), (torch.rand(64) + 0.5).bfloat16()
    body = _kernel_body(fn, (x, y), tmp_path, monkeypatch)
    assert " / " not in body and "libdevice.sqrt(" not in body, body
    assert "div_rn" in body or "sqrt_rn" in body, body


@triton.jit
def _product_minus_sum(a, b, c, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out + i, tl.load(a + i) * tl.load(b + i) - tl.load(c + i))


def _ptx(options):
    src = ASTSource(_product_minus_sum, {"a": "*fp32", "b": "*fp32", "c": "*fp32", "out": "*fp32", "N": "constexpr"},
                    constexprs={"N": 128})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def test_cuda_compile_options_round_each_product_as_eager():
    """x * y - c contracted to one FMA keeps the product unrounded: layer_norm's gradient over one
    element was then the product's rounding error (6e-6 on the H100) where eager's is exactly 0."""
    from smelt.runtime.cuda_binary import CUDA_COMPILE_OPTIONS
    assert "fma.rn.f32" in _ptx({})  # Triton's default contracts: the check below can fail
    ptx = _ptx(CUDA_COMPILE_OPTIONS)
    assert "fma.rn.f32" not in ptx and "mul.rn.f32" in ptx


def test_compiled_binaries_use_the_cuda_compile_options(monkeypatch):
    from smelt.runtime import cuda_binary
    seen = {}
    real = triton.compile

    def compile_and_note(source, target=None, options=None):
        seen.update(options or {})
        return real(source, target=target, options=options)

    monkeypatch.setattr(triton, "compile", compile_and_note)
    spec = (("ptr", "torch.float32", True),) * 4
    try:
        cuda_binary.compile_binary(_product_minus_sum, spec, {"N": 128}, 4, (9, 0))
    except cuda_binary.CudaError:
        pass  # only the options matter here
    assert seen.get("enable_fp_fusion") is False


def test_division_by_a_power_of_two_is_a_product_by_its_reciprocal(tmp_path, monkeypatch):
    """x / 2**k and x * 2**-k are the same real number, so one rounding gives the same float32 (subnormal
    results too): a product, cheaper than div_rn. Other divisors keep div_rn."""
    x = torch.randn(1000) * torch.logspace(-38, 38, 1000)

    def fn(x):
        return x / 8.0, x / -0.25, (x * 1e-30) / 2.0 ** 100, x / 3.0
    body = _kernel_body(fn, (x,), tmp_path, monkeypatch, atol=0, rtol=0)
    assert "* 0.125" in body and "* -4.0" in body and body.count("div_rn") == 1, body
