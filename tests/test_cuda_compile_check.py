"""SMELT_CHECK_CUDA_COMPILE: kernels run by Triton's interpreter are also compiled for an H100
(sm_90) on the CPU (smelt/runtime/cuda_compile_check.py), since the interpreter runs code that the
GPU compiler refuses: the fuzzer's H100 run found float64 kernels whose libdevice calls took a
float32 literal (`libdevice.fmod(tmp0, 3.0)`), which passed on the CPU.

A compile for sm_90 takes a few tenths of a second on the 2-core machine, so each test compiles
few kernels: the op tests put every op of a dtype into one graph (one or two kernels), and the tests
that compile graphs run in the Triton pass of `make test` only (they force the Triton CPU backend
themselves, so the Halide pass would repeat them). The file takes about 10 s."""
import os
import re

import pytest
import torch
import torch.nn.functional as F

from smelt.artifact import CudaTwin
from smelt.artifact import BlockConfig
from smelt.errors import KernelCompileError
from smelt.runtime import cuda_compile_check
from smelt.runtime.cuda_compile_check import CudaCompileCheck
from smelt.runtime.loader import source_path

pytestmark = pytest.mark.smelt_only
# Tests that compile a whole graph: forced onto the Triton backend, so once per `make test` is enough.
triton_pass_only = pytest.mark.skipif(os.environ.get("SMELT_CPU_BACKEND") != "triton",
                                      reason="forces the Triton CPU backend: runs in the Triton pass of make test")

# The kernel the H100 refused (fuzzer finding: torch.div(x_f64, 3, rounding_mode='floor')), as it was
# generated: Triton finds no libdevice.fmod for (float64, float32).
REFUSED = '''
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def triton_poi_fused_div_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)
    tmp0 = tl.load(in_ptr0 + (0))
    tmp1 = libdevice.fmod(tmp0, 3.0)
    tl.store(out_ptr0 + (tl.full([XBLOCK], 0, tl.int32)), tl.broadcast_to(tmp1, [XBLOCK]))
'''
# The same kernel with its literal typed as the tensor it meets: it compiles.
ACCEPTED = REFUSED.replace("libdevice.fmod(tmp0, 3.0)", "libdevice.fmod(tmp0, tl.full([], 3.0, tl.float64))")


@pytest.fixture
def compiles(monkeypatch):
    """The names of the CUDA forms compiled for sm_90 during the test (none remembered from before)."""
    monkeypatch.setattr(cuda_compile_check, "_outcomes", {})
    names = []
    real = CudaCompileCheck._compile

    def spy(self, spec):
        names.append(self.twin.name)
        return real(self, spec)
    monkeypatch.setattr(CudaCompileCheck, "_compile", spy)
    return names


@pytest.fixture
def checked(monkeypatch, compiles):
    """Graphs compile for the Triton interpreter with the check on."""
    monkeypatch.setenv("SMELT_CPU_BACKEND", "triton")
    monkeypatch.setenv("SMELT_CHECK_CUDA_COMPILE", "1")
    return compiles


def _check(source: str, tmp_path) -> CudaCompileCheck:
    twin = CudaTwin(name="triton_poi_fused_div_0", source=source, workspace=None, ticket=False, combo=False,
                    config=BlockConfig(XBLOCK=1, RBLOCK=None, num_warps=2, persistent=False))
    path = source_path(str(tmp_path), twin.name, source)
    return CudaCompileCheck(twin, path, ["aten.div.Tensor_mode"], cache_dir=None)


def test_a_kernel_the_gpu_compiler_refuses_raises_naming_it(tmp_path, compiles):
    check = _check(REFUSED, tmp_path)
    args = (torch.zeros(1, 1, dtype=torch.float64), torch.empty(1, 1, dtype=torch.float64), 1)
    with pytest.raises(KernelCompileError, match=r"kernel triton_poi_fused_div_0 failed to compile for CUDA sm_90.*"
                       r"source: .*triton_poi_fused_div_0_\w+\.py; from ATen ops: aten\.div\.Tensor_mode; "
                       r"error: CompilationError at `tmp1 = libdevice\.fmod\(tmp0, 3\.0\)`: "
                       r"KeyError: \(triton\.language\.float64, triton\.language\.float32\)"):
        check(args)
    with pytest.raises(KernelCompileError):  # raised again, from what the first launch found
        check(args)
    assert compiles == ["triton_poi_fused_div_0"]


def test_a_kernel_that_compiles_is_compiled_once_per_argument_description(tmp_path, compiles):
    check = _check(ACCEPTED, tmp_path)
    check((torch.zeros(1, 1, dtype=torch.float64), torch.empty(1, 1, dtype=torch.float64), 1))
    check((torch.ones(1, 1, dtype=torch.float64), torch.empty(1, 1, dtype=torch.float64), 1))
    assert compiles == ["triton_poi_fused_div_0"]
    check((torch.zeros(1, 1, dtype=torch.float64), torch.empty(1, 1, dtype=torch.float64), 2 ** 40))  # an i64 size
    assert len(compiles) == 2


@triton_pass_only
def test_the_fuzzers_repro_compiles_for_the_gpu(checked):
    # Before the fix the check raised here, as the H100 did (finding 1 of the fuzzer's GPU run).
    x = torch.randn(1, 1, dtype=torch.float64) * 10
    fn = torch.compile(lambda x: torch.div(x, 3, rounding_mode="floor"), backend="smelt", fullgraph=True)
    torch.testing.assert_close(fn(x), torch.div(x, 3, rounding_mode="floor"))
    _every_kernel_was_checked(checked)


@triton_pass_only
def test_a_graph_whose_kernel_the_gpu_would_refuse_fails_to_compile(checked, monkeypatch):
    # The typing of a float64 constant undone for the GPU form only (the divisor printed as a bare
    # float32 literal, as before 2b52496): the interpreter still runs the kernel, the check refuses it.
    from smelt.codegen.triton.handler import TritonOps
    typed = TritonOps._libdevice_operand
    monkeypatch.setattr(TritonOps, "_libdevice_operand",
                        lambda self, x, dtype: typed(self, x, dtype) if self.k.interpret or x.rank else "3.0")
    x = torch.randn(4, dtype=torch.float64)
    fn = torch.compile(lambda x: torch.fmod(x, 3), backend="smelt", fullgraph=True)
    with pytest.raises(KernelCompileError, match=r"failed to compile for CUDA sm_90.*aten\.fmod\.Scalar.*KeyError"):
        fn(x)
    monkeypatch.delenv("SMELT_CHECK_CUDA_COMPILE")
    torch._dynamo.reset()
    torch.testing.assert_close(fn(x), torch.fmod(x, 3))  # without the check, the interpreter runs it


def _every_kernel_was_checked(checked):
    """Each kernel of the graphs compiled was compiled for sm_90 once (one argument description each)."""
    import smelt.observe
    kernels = [name for graph in smelt.observe.compiled_graphs() for name in graph.kernel_names]
    assert kernels and len(checked) == len(kernels), (checked, kernels)


def _binary_ops(x, y):
    """Every binary op with a libdevice or division form, on two tensors and on a tensor and a
    literal (torch.full_like becomes a literal in the kernel)."""
    three = torch.full_like(x, 3.0)
    out = []
    for other in (y, three):
        out += [x / other, torch.div(x, other, rounding_mode="floor"), torch.div(x, other, rounding_mode="trunc"),
                torch.remainder(x, other), torch.fmod(x, other), torch.pow(x.abs(), other), torch.atan2(x, other),
                torch.hypot(x, other), torch.copysign(x, other), torch.maximum(x, other), torch.nextafter(x, other)
                if x.dtype != torch.bfloat16 else x]
    out += [torch.div(x, 3, rounding_mode="floor"), torch.remainder(x, 3), torch.fmod(x, 3), x.abs() ** 2.5,
            2.0 ** x, torch.copysign(x, -0.0), torch.remainder(3, y)]
    return out


@triton_pass_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_binary_ops_compile_for_the_gpu(dtype, checked):
    x = torch.randn(37, dtype=dtype) * 4
    y = torch.randn(37, dtype=dtype) + 4
    fn = torch.compile(_binary_ops, backend="smelt", fullgraph=True)
    for got, want in zip(fn(x, y), _binary_ops(x, y)):
        torch.testing.assert_close(got, want, equal_nan=True, atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                   rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    _every_kernel_was_checked(checked)


def _reductions(x):
    return (x.sum(-1), x.amax(-1), x.argmax(-1), torch.var_mean(x, -1), torch.softmax(x, -1), x.cumsum(-1),
            torch.remainder(x, 3).sum(), x.double().prod(0))


@triton_pass_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_reductions_compile_for_the_gpu(dtype, checked):
    x = torch.randn(8, 33, dtype=dtype)
    fn = torch.compile(_reductions, backend="smelt", fullgraph=True)
    torch.testing.assert_close(fn(x), _reductions(x), atol=1e-2, rtol=1e-2)
    _every_kernel_was_checked(checked)


@triton_pass_only
def test_a_combo_kernel_compiles_for_the_gpu(checked):
    # Fuzzer finding: a combo kernel's float64 floor division refused by the H100.
    def fn(x, index):
        return torch.div(x, 3, rounding_mode="floor").gather(2, index), x.pow(3), x.amax(-1)
    x = torch.randn(1, 2, 5, dtype=torch.float64)
    index = torch.randint(0, 5, (1, 2, 3))
    compiled = torch.compile(fn, backend="smelt", fullgraph=True)
    torch.testing.assert_close(compiled(x, index), fn(x, index))
    _every_kernel_was_checked(checked)
    assert any(name.startswith("triton_combo") for name in checked)


@triton_pass_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_multiplying_scatter_in_a_2d_block_compiles_for_the_gpu(dtype, checked):
    # H100 fuzzer finding: scatter_reduce(prod) beside a reduction (a [XBLOCK, 1] block) looped while
    # a one-element tensor, not a scalar, was positive: Triton refused the loop condition.
    def fn(x, src, index):
        return x.scatter_reduce(0, index, src, "prod", include_self=True), index.sum(0)
    x, src, index = torch.randn(6, dtype=dtype), torch.randn(1, dtype=dtype), torch.tensor([4])
    compiled = torch.compile(fn, backend="smelt", fullgraph=True)
    torch.testing.assert_close(compiled(x, src, index), fn(x, src, index))
    _every_kernel_was_checked(checked)


@triton_pass_only
def test_a_cached_graph_keeps_its_kernels_cuda_forms(checked, monkeypatch, tmp_path):
    # The CUDA forms travel in the graph cache's JSON: a graph read back is checked too, its
    # compiled binary read from the kept kernels instead of compiled again.
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "1")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    from smelt.codegen.triton import backend as triton_backend
    generated = []
    real = triton_backend._cuda_twin
    monkeypatch.setattr(triton_backend, "_cuda_twin", lambda *a: generated.append(a) or real(*a))
    x = torch.randn(5, dtype=torch.float64)
    for _ in range(2):
        torch._dynamo.reset()
        monkeypatch.setattr(cuda_compile_check, "_outcomes", {})
        fn = torch.compile(lambda x: torch.remainder(x, 3) * 2, backend="smelt", fullgraph=True)
        torch.testing.assert_close(fn(x), torch.remainder(x, 3) * 2)
    assert len(generated) == 1 and len(checked) == 2 and checked[0] == checked[1]
    assert len(list((tmp_path / "kernels").glob("*/*/kernel.cubin"))) == 1


_AFTER_DROPOUT = """
import tempfile, torch, smelt
with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, cache_dir=tempfile.mkdtemp()):
    torch.compile(lambda x: torch.nn.functional.dropout(x, 0.3, training=True) * 2, backend="smelt")(torch.randn(99))
    torch._dynamo.reset()
    torch.compile(lambda x: x.sin() / 3, backend="smelt")(torch.randn(99))
print("compiled")
"""


def test_gpu_compiles_still_work_after_an_interpreted_kernel_called_a_device_function(tmp_path):
    # Dropout's kernel calls Philox's @jit functions; Triton's interpreter used to leave
    # triton.language patched after such a call, and the GPU compiles after it failed ("'value'
    # object has no attribute 'dtype'"). In a fresh process: the failure depended on what the
    # process had compiled before, and Triton's own cache would hide it.
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("SMELT_CHECK_CUDA_COMPILE", "TRITON_INTERPRET")}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", _AFTER_DROPOUT], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("compiled"), done.stderr[-3000:]


_UNDER_TRITON_INTERPRET = """
import tempfile, torch, smelt
with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, cache_dir=tempfile.mkdtemp()):
    torch.compile(lambda x: x.sum(-1), backend="smelt")(torch.randn(4, 99))
"""


def test_the_check_under_triton_interpret_names_the_knob_instead_of_failing_every_reduction(tmp_path):
    # With TRITON_INTERPRET=1 at Triton's import, tl.standard's combines are interpreter-only and
    # every reduction's CUDA compile failed with "'InterpretedFunction' object has no attribute
    # 'signature'" (fuzz seed 4379, run so by hand).
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "SMELT_CHECK_CUDA_COMPILE"}
    env.update(TRITON_INTERPRET="1", TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _UNDER_TRITON_INTERPRET], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode != 0
    assert "SMELT_CHECK_CUDA_COMPILE cannot compile for CUDA" in done.stderr and "TRITON_INTERPRET=1" in done.stderr, \
        done.stderr[-3000:]
    assert "InterpretedFunction" not in done.stderr, done.stderr[-3000:]


@triton_pass_only
def test_short_rows_written_back_run_a_few_rows_a_program_on_the_gpu(checked, monkeypatch):
    # Swin's 49-key softmax: 64 rows over 8 warps took twice the time of 8 rows over 2 on the H200
    # (codegen/triton/kernel.py SHORT_ROW); longer rows keep their blocks.
    from smelt.codegen.triton import backend as triton_backend
    twins = []
    real = triton_backend._cuda_twin
    monkeypatch.setattr(triton_backend, "_cuda_twin", lambda *a: twins.append(real(*a)) or twins[-1])
    for width, want in ((49, (8, 64, 2)), (300, (8, 512, 4))):
        torch._dynamo.reset()
        x = torch.randn(4096, width, dtype=torch.bfloat16)
        fn = torch.compile(lambda x: torch.softmax(x, -1), backend="smelt", fullgraph=True)
        torch.testing.assert_close(fn(x), torch.softmax(x, -1), atol=1e-2, rtol=1e-2)
        config = twins[-1].config
        assert (config.XBLOCK, config.RBLOCK, config.num_warps, config.persistent) == (*want, True), config
    assert len(checked) == 2  # each compiled for sm_90


@triton_pass_only
def test_rows_gathered_from_pieces_are_planned_as_rows(checked, monkeypatch):
    # Swin's patch merging concatenates four neighbours' channels before a layer norm: the row's index
    # is Mods and floors of rindex, with no plain rindex term, yet it reads runs of C elements. Judged
    # a column reduction it looped over 64 x 64 blocks (2-5x slower on the H200).
    from smelt.codegen.triton import backend as triton_backend
    twins = []
    real = triton_backend._cuda_twin
    monkeypatch.setattr(triton_backend, "_cuda_twin", lambda *a: twins.append(real(*a)) or twins[-1])

    def merge_and_norm(x, weight, bias):
        b, h, w, c = x.shape
        x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return torch.nn.functional.layer_norm(x, (4 * c,), weight, bias)

    x = torch.randn(2, 8, 8, 48, dtype=torch.bfloat16)
    weight, bias = torch.randn(192, dtype=torch.bfloat16), torch.randn(192, dtype=torch.bfloat16)
    fn = torch.compile(merge_and_norm, backend="smelt", fullgraph=True)
    torch.testing.assert_close(fn(x, weight, bias), merge_and_norm(x, weight, bias), atol=3e-2, rtol=3e-2)
    config = twins[-1].config
    assert config.persistent and config.RBLOCK == 256, config  # the whole row at once


@triton_pass_only
def test_batch_norm_over_channels_last_rows_computes_per_channel_values_once_per_tile_column(checked, monkeypatch):
    # A BN + SiLU over 32 channels-last channels is walked as [positions x channels] tiles, so the
    # per-channel sqrt and division happen once per tile column (on the H200 32.2 -> 28.5 us); over
    # 96 channels a tile would half-mask its second block, so the flat walk stays.
    from smelt.codegen.triton import backend as triton_backend
    twins = []
    real = triton_backend._cuda_twin
    monkeypatch.setattr(triton_backend, "_cuda_twin", lambda *a: twins.append(real(*a)) or twins[-1])

    def bn_silu(x, mean, var, weight, bias):
        return torch.nn.functional.silu(torch.nn.functional.batch_norm(x, mean, var, weight, bias, False, 0.0, 1e-5))

    import smelt.config
    for channels, setting, tiled in ((32, "auto", True), (96, "auto", False), (32, "off", False)):
        torch._dynamo.reset()
        x = torch.randn(2, channels, 16, 16, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        args = (x, torch.randn(channels, dtype=torch.bfloat16), torch.rand(channels, dtype=torch.bfloat16) + 0.5,
                torch.randn(channels, dtype=torch.bfloat16), torch.randn(channels, dtype=torch.bfloat16))
        with smelt.config.override(row_value_tiles=setting):
            fn = torch.compile(bn_silu, backend="smelt", fullgraph=True)
            torch.testing.assert_close(fn(*args), bn_silu(*args), atol=3e-2, rtol=3e-2)
        twin = twins[-1]
        assert (twin.config.tiles is not None) == tiled, twin.config
        if tiled:
            assert (twin.config.XBLOCK * twin.config.RBLOCK, twin.config.num_warps) == (2048, 4), twin.config
            # the variance's square root on the tile's row of channels, [1, RBLOCK], not per element
            assert re.search(r"tl\.load\(in_ptr\d \+ \(rindex\)\)", twin.source), twin.source


@triton_pass_only
def test_values_rounded_to_bfloat16_take_the_approximate_forms_on_the_gpu(checked, monkeypatch):
    # lowering/half_rounding.py: on the GPU such a quotient is Triton's `/` (div.full.f32) and such a root
    # PTX's sqrt.approx.f32, inline (libdevice.sqrt is the .ftz form, which flushes subnormal inputs);
    # under the interpreter the root is eager's sqrt. Both forms must compile for sm_90.
    from smelt.codegen.triton import backend as triton_backend
    twins = []
    real = triton_backend._cuda_twin
    monkeypatch.setattr(triton_backend, "_cuda_twin", lambda *a: twins.append(real(*a)) or twins[-1])

    def fn(x, y):
        return torch.sqrt(y), F.silu(x), torch.softmax(x, -1), x / y
    x, y = torch.randn(8, 33, dtype=torch.bfloat16), torch.rand(8, 33, dtype=torch.bfloat16) + 0.5
    torch.testing.assert_close(torch.compile(fn, backend="smelt", fullgraph=True)(x, y), fn(x, y), atol=1e-2, rtol=1e-2)
    _every_kernel_was_checked(checked)
    body = "\n".join(line for t in twins for line in t.source.splitlines() if line.startswith("    tmp"))
    assert 'inline_asm_elementwise("sqrt.approx.f32' in body and " / " in body, body
    assert "div_rn" not in body and "sqrt_rn" not in body and "libdevice.sqrt" not in body, body
