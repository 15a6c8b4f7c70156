"""A T5-like attention (its bias a permute of an embedding) runs SDPA's memory-efficient kernel on
CUDA, not its math path (lowering/attention_masks.py), with eager's values and gradients."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _attention(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.permute(0, 3, 1, 2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_permuted_bias_runs_the_efficient_kernel(dtype, compile_fn, assert_close, observe):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 128, 128, 8, device="cuda", dtype=dtype, requires_grad=True)
    expected = _attention(q, k, v, bias)
    expected.float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    observe.reset()
    actual = compile_fn(_attention)(q, k, v, bias)
    actual.float().square().sum().backward()
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-3, "rtol": 1e-3}
    assert_close(actual, expected, **tolerance)
    for t, want in zip((q, k, v, bias), grads):
        assert_close(t.grad, want, **tolerance)
    source = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
    assert "_scaled_dot_product_efficient_attention" in source, source[:3000]
    assert "torch.bmm" not in source
