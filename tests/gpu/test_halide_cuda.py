"""SMELT_CUDA_BACKEND=halide: Halide's CUDA kernels against eager on the GPU. Skipped without CUDA."""
import logging

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"), pytest.mark.smelt_only]
# The GPU machine has no halide of its own: `GPU_CHECK_PARTS=halide scripts/gpu_check` brings it.
pytest.importorskip("halide", reason="halide is not installed (scripts/halide_wheel packs it for the GPU machine)")

import smelt  # noqa: E402,F401
import smelt.observe  # noqa: E402

CUDA = "cuda"


@pytest.fixture(autouse=True)
def halide_on_cuda(monkeypatch):
    monkeypatch.setenv("SMELT_CUDA_BACKEND", "halide")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run_both(fn, *args, tol=1e-5, all_halide=True):
    actual = torch.compile(fn, backend="smelt", fullgraph=True)(*args)
    expected = fn(*args)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol, equal_nan=True)
    names = smelt.observe.compiled_graphs()[-1].kernel_names
    if all_halide:
        assert names and all(n.startswith("halide_") for n in names), names
    return actual


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=CUDA, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_pointwise(dtype):
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    run_both(lambda a, b: torch.sigmoid(a) * b + torch.tanh(a - b) / (b.abs() + 1), randn(1031, 17, dtype=dtype),
             randn(1031, 17, dtype=dtype), tol=tol)


def test_bf16_rounds_as_eager():
    # Rounded after each op as eager rounds it (the policy of 6fa8637; test_halide.py's
    # test_half_chains_round_each_op_as_eager on the CPU). This test had kept the round-once result.
    x = randn(4099, dtype=torch.bfloat16)
    fn = lambda a: (a * 3 + 1) * a  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="smelt")(x), fn(x), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_pointwise(dtype):
    x = torch.randint(0, 50, (517,), device=CUDA, dtype=dtype)
    y = torch.randint(1, 9, (517,), device=CUDA, dtype=dtype)
    run_both(lambda a, b: (a * b + 3) // b - a % b + torch.maximum(a, b), x, y, tol=0)


@pytest.mark.parametrize("shape", [(37, 1000), (3, 5), (4, 70000), (20000, 3)], ids=str)
@pytest.mark.parametrize("op", ["sum", "amax", "amin", "argmax", "argmin", "prod"])
def test_row_reductions(op, shape):
    x = randn(*shape)
    if op == "prod":
        x = 1 + x / 100
    fn = {"sum": lambda t: t.sum(-1), "amax": lambda t: t.amax(-1), "amin": lambda t: t.amin(-1),
          "argmax": lambda t: t.argmax(-1), "argmin": lambda t: t.argmin(-1), "prod": lambda t: t.prod(-1)}[op]
    run_both(fn, x, tol=1e-4 * (shape[-1] ** 0.5))


def test_column_and_global_reductions():
    x = randn(1000, 37)
    run_both(lambda t: (t.sum(0), t.amax(0), t.argmax(0)), x, tol=1e-4)
    run_both(lambda t: t.sum(), randn(100003), tol=1e-3)


def test_argmax_first_index_and_nan():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0]], device=CUDA)
    run_both(lambda t: (t.argmax(-1), t.amax(-1), t.argmin(-1)), x, tol=0)


@pytest.mark.parametrize("shape", [(33, 129), (64, 4096), (8, 50000)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_and_log_softmax(shape, dtype):
    x = randn(*shape, dtype=dtype) * 4
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    run_both(lambda t: (F.softmax(t, -1), F.log_softmax(t, -1)), x, tol=tol)


def test_welford_var_mean_and_layer_norm():
    x = randn(129, 1000) * 3 + 2
    run_both(lambda t: torch.var_mean(t, -1), x, tol=1e-4)
    w, b = randn(1000), randn(1000)
    run_both(lambda t, w, b: F.layer_norm(t, (1000,), w, b), x, w, b, tol=1e-4)
    run_both(lambda t: torch.var(t, 0), randn(5000, 7), tol=1e-4)


def test_transpose_and_permute():
    run_both(lambda t: t.t().contiguous() * 2, randn(1025, 513))
    run_both(lambda t: t.permute(2, 0, 1).contiguous() + 1, randn(7, 33, 65))


def test_scans():
    x = randn(37, 1000)
    run_both(lambda t: (t.cumsum(-1), t.cummax(-1).values), x, tol=1e-4)


def test_gather_and_index_add():
    x, i = randn(100, 7), torch.randint(0, 100, (50,), device=CUDA)
    run_both(lambda t, k: t[k] * 2, x, i)
    v, j = randn(30, 4), torch.randint(0, 10, (30,), device=CUDA)
    run_both(lambda t, k, u: t.index_add(0, k, u), randn(10, 4), j, v, tol=1e-5)


def test_in_place_update_and_views():
    def fn(t, u):
        t.mul_(2).add_(u[:, 1:].sum(-1, keepdim=True))
        return t
    x, y = randn(33, 5), randn(33, 9)
    expected = fn(x.clone(), y)
    actual = torch.compile(fn, backend="smelt")(x, y)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(x, expected)


def test_dropout_draws_in_the_kernel():
    x = randn(1 << 16) + 3
    torch.manual_seed(0)
    out = torch.compile(lambda t: F.dropout(t, 0.25, training=True), backend="smelt")(x)
    kept = out != 0
    assert 0.72 < kept.float().mean().item() < 0.78
    torch.testing.assert_close(out[kept], x[kept] / 0.75)
    torch.manual_seed(0)
    again = torch.compile(lambda t: F.dropout(t, 0.25, training=True), backend="smelt")(x)
    torch.testing.assert_close(out, again, atol=0, rtol=0)


def test_runs_on_the_current_stream():
    x = randn(4096, 1024)
    fn = torch.compile(lambda t: torch.softmax(t * 2, -1), backend="smelt")
    fn(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = x.clone()  # queued on `stream`: the kernel must run after it
        out = fn(y)
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(out, torch.softmax(x * 2, -1))


def test_empty_and_large_batches():
    run_both(lambda t: t * 2 + 1, randn(0, 5), all_halide=False)
    run_both(lambda t: t.sum(-1), randn(1 << 20, 4), tol=1e-5)


def test_backward_through_halide_kernels():
    x = randn(64, 300).requires_grad_()
    fn = torch.compile(lambda t: (F.gelu(t) * torch.softmax(t, -1)).sum(), backend="smelt")
    fn(x).backward()
    grad, x.grad = x.grad, None
    (F.gelu(x) * torch.softmax(x, -1)).sum().backward()
    torch.testing.assert_close(grad, x.grad, atol=1e-4, rtol=1e-4)


def test_unsupported_kernel_falls_back_to_triton_with_a_log(caplog, monkeypatch):
    from smelt.codegen.halide import ops as halide_ops
    monkeypatch.delitem(halide_ops.FLOAT_UNARY, "tanh")
    with caplog.at_level(logging.WARNING, logger="smelt"):
        run_both(lambda t: (torch.tanh(t) + 1, t.sum(-1)), randn(33, 65), tol=1e-5, all_halide=False)
    assert "runs in Triton instead" in caplog.text and "op tanh on torch.float32" in caplog.text
    names = smelt.observe.compiled_graphs()[-1].kernel_names
    assert any(not n.startswith("halide_") for n in names), names


def test_triton_stays_the_default(monkeypatch):
    monkeypatch.delenv("SMELT_CUDA_BACKEND")
    torch._dynamo.reset()
    torch.compile(lambda t: t.sin() + 1, backend="smelt")(randn(100))
    names = smelt.observe.compiled_graphs()[-1].kernel_names
    assert names and not any(n.startswith("halide_") for n in names)

