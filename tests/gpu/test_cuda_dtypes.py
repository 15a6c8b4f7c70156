"""CUDA-only tests: half-precision dtypes and GPU-sized shapes. Skipped without CUDA.

The rest of the suite also runs on CUDA with SMELT_TEST_DEVICE=cuda; this file adds what
only makes sense on a GPU (fp16/bf16 compute, larger shapes).
"""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = "cuda"
HALF_DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
# fused kernels keep fp32 intermediates while eager rounds after every op
CHAIN_TOL = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x, y: x + y, id="add"),
        pytest.param(lambda x, y: x * y - 1, id="mul_sub"),
        pytest.param(lambda x, y: torch.exp(x) / (y.abs() + 1), id="exp_div"),
        pytest.param(lambda x, y: F.gelu(x) + F.silu(y), id="gelu_silu"),
        pytest.param(lambda x, y: torch.where(x > y, x.tanh(), y.sigmoid()), id="where"),
        pytest.param(lambda x, y: torch.maximum(x, y).clamp(-1, 1), id="max_clamp"),
    ],
)
def test_half_pointwise_matches_eager(fn, dtype, check):
    x = torch.randn(129, 257, device=CUDA, dtype=dtype)
    y = torch.randn(129, 257, device=CUDA, dtype=dtype)
    actual, _ = check(fn, x, y, **CHAIN_TOL)
    assert actual.dtype == dtype


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("fn", [
    pytest.param(lambda x, y: x / y, id="div"), pytest.param(lambda x, y: F.silu(x), id="silu"),
    pytest.param(lambda x, y: torch.sigmoid(x), id="sigmoid"), pytest.param(lambda x, y: F.hardswish(x), id="hardswish"),
    pytest.param(lambda x, y: y.reciprocal(), id="reciprocal"),
    pytest.param(lambda x, y: (y.float().sqrt() * 3).to(y.dtype), id="sqrt"),
])
def test_half_results_of_approximate_division_are_eagers_but_at_rare_ties(fn, dtype):
    """These divide with div.full.f32 and take roots with sqrt.approx.f32 (lowering/half_rounding.py): a
    result may differ from eager's only where the float32 value lies a few ulps from a half float's
    rounding boundary (a bfloat16 ulp spans 2**16 float32 ulps, a float16 one 2**13), and then by one ulp."""
    x = torch.randn(1 << 20, device=CUDA, dtype=dtype) * 4
    y = torch.rand(1 << 20, device=CUDA, dtype=dtype) + 0.5
    torch._dynamo.reset()
    actual, expected = torch.compile(fn, backend="smelt")(x, y), fn(x, y)
    assert (actual != expected).float().mean().item() < (1e-3 if dtype == torch.bfloat16 else 4e-3)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)


def test_float32_division_by_powers_of_two_is_eagers_bit_for_bit():
    """Spelled as a product by the reciprocal (codegen/triton/handler.py): subnormal results included."""
    x = torch.randn(4096, device=CUDA) * torch.logspace(-38, 38, 4096, device=CUDA)

    def fn(x):
        return x / 8.0, x / -0.25, (x * 1e-30) / 2.0 ** 100
    torch._dynamo.reset()
    for actual, expected in zip(torch.compile(fn, backend="smelt")(x), fn(x)):
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_to_float_and_back_casts(dtype, check):
    x = torch.randn(129, 257, device=CUDA, dtype=dtype)
    check(lambda x: (x.float() * 3, (x.float() + 0.5).to(dtype), x.to(torch.int32)), x)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(33, 129), (64, 4096), (8, 50000)], ids=str)
def test_half_softmax(shape, dtype, check):
    x = torch.randn(shape, device=CUDA, dtype=dtype) * 4
    actual, _ = check(lambda x: F.softmax(x, dim=-1), x)
    assert actual.dtype == dtype


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_log_softmax_middle_dim(dtype, check):
    x = torch.randn(8, 129, 33, device=CUDA, dtype=dtype)
    check(lambda x: F.log_softmax(x, dim=1), x, **CHAIN_TOL)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [(33, 129), (16, 8192)], ids=str)
def test_half_layer_norm(shape, dtype, check):
    x = torch.randn(shape, device=CUDA, dtype=dtype)
    w = torch.randn(shape[-1], device=CUDA, dtype=dtype)
    b = torch.randn(shape[-1], device=CUDA, dtype=dtype)
    check(lambda x, w, b: F.layer_norm(x, shape[-1:], w, b), x, w, b, **CHAIN_TOL)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_sum_and_amax_accumulate_in_fp32(dtype, check):
    x = torch.randn(64, 8192, device=CUDA, dtype=dtype)
    # bf16 sums of 8192 elements: compare against eager (which accumulates in fp32 too)
    check(lambda x: (x.sum(dim=-1), x.amax(dim=-1), x.mean(dim=0)), x, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_argmax_ties(dtype, check):
    x = torch.randint(0, 4, (64, 1000), device=CUDA).to(dtype)
    check(lambda x: (x.argmax(dim=-1), x.argmin(dim=0)), x)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_linear_with_epilogue(dtype, check):
    x = torch.randn(128, 256, device=CUDA, dtype=dtype)
    w = torch.randn(64, 256, device=CUDA, dtype=dtype) * 0.05
    b = torch.randn(64, device=CUDA, dtype=dtype)
    check(lambda x, w, b: F.relu(F.linear(x, w, b)) * 2, x, w, b, **CHAIN_TOL)


def test_large_fp32_reduction_one_million_elements(check):
    x = torch.randn(1 << 20, device=CUDA)
    check(lambda x: (x.sum(), x.amax(), x.argmax(), torch.var_mean(x)), x, atol=1e-2, rtol=1e-4)


def test_mixed_precision_autocast_mlp(compile_fn, assert_close):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to(CUDA)
    x = torch.randn(64, 256, device=CUDA)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        expected = model(x)
        actual = compile_fn(model)(x)
    assert actual.dtype == expected.dtype
    assert_close(actual, expected, **CHAIN_TOL)


def test_bf16_training_step_grads(compile_fn, assert_close):
    import copy

    ref = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(CUDA, torch.bfloat16)
    model = copy.deepcopy(ref)
    x = torch.randn(32, 64, device=CUDA, dtype=torch.bfloat16)
    t = torch.randint(0, 10, (32,), device=CUDA)
    loss = F.cross_entropy(compile_fn(model)(x), t)
    loss.backward()
    ref_loss = F.cross_entropy(ref(x), t)
    ref_loss.backward()
    assert_close(loss, ref_loss, **CHAIN_TOL)
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, p_ref.grad, atol=5e-2, rtol=5e-2)
