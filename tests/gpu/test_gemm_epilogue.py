"""Linear layers whose GELU (tanh) or ReLU runs in cuBLASLt's epilogue, against eager (CUDA only)."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _mlp(act):
    def mlp(x, w1, b1, w2, b2):
        return F.linear(act(F.linear(x, w1, b1)), w2, b2)
    return mlp


def _inputs(dtype, requires_grad=False):
    torch.manual_seed(0)
    x = torch.randn(4, 64, 256, device="cuda", dtype=dtype)
    w1 = torch.randn(1024, 256, device="cuda", dtype=dtype) / 16
    b1 = torch.randn(1024, device="cuda", dtype=dtype)
    w2 = torch.randn(256, 1024, device="cuda", dtype=dtype) / 32
    b2 = torch.randn(256, device="cuda", dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, w1, b1, w2, b2)]


def _wrappers(observe):
    return "\n".join(g.wrapper_source for g in observe.compiled_graphs())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name, act", [("gelu", lambda y: F.gelu(y, approximate="tanh")), ("relu", F.relu)])
def test_activation_runs_in_the_product(name, act, dtype, compile_fn, assert_close, observe, kernel_count):
    fn = _mlp(act)
    args = _inputs(dtype)
    expected = fn(*args)
    assert_close(compile_fn(fn)(*args), expected, rtol=2e-2, atol=2e-2)
    assert "_addmm_activation" in _wrappers(observe)
    assert kernel_count() == 0  # both products are cuBLAS calls; nothing is left for a kernel


def test_training_keeps_the_pre_activation(compile_fn, assert_close, observe):
    # GELU's backward needs its input, so the forward product is not rewritten.
    fn = _mlp(lambda y: F.gelu(y, approximate="tanh"))
    args = _inputs(torch.bfloat16, requires_grad=True)
    eager_args = [a.detach().clone().requires_grad_() for a in args]
    compile_fn(fn)(*args).sum().backward()
    fn(*eager_args).sum().backward()
    for a, e in zip(args, eager_args):
        assert_close(a.grad, e.grad, rtol=5e-2, atol=5e-2)
    assert "_addmm_activation" not in _wrappers(observe)


def test_setting_turns_it_off(monkeypatch, compile_fn, assert_close, observe):
    monkeypatch.setenv("SMELT_GEMM_EPILOGUES", "0")
    fn = _mlp(F.relu)
    args = _inputs(torch.bfloat16)
    assert_close(compile_fn(fn)(*args), fn(*args), rtol=2e-2, atol=2e-2)
    assert "_addmm_activation" not in _wrappers(observe)
