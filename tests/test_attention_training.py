"""Training through scaled_dot_product_attention: outputs and every gradient against eager, judged
by the accuracy rule (float64 reference). Attention gradients were wrong on the CPU (torch's
decomposition of the CPU flash kernel returns probabilities where its backward reads logsumexp)
and on CUDA (q, k and v sliced from one computed projection were handed to the flash and cuDNN
kernels as dense copies, whose output layout then differed from the traced one)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from smelt.tools.accuracy import assert_accurate, to_float64

KERNELS = ["default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def _attention(kernel, mask, bias, computed, heads=4):
    def f(x):
        b, t, _ = x.shape
        q, k, v = (x * 1.5 if computed == "sliced_projection" else x).chunk(3, dim=2)
        q, k, v = (z.view(b, t, heads, -1) for z in (q, k, v))
        if computed == "per_head_product":  # dense [b, t, h, d] values, as a rotary embedding makes
            q, k, v = q * 1.5, k.sin(), v * 0.5
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        kw = {"is_causal": True} if mask == "causal" else {"attn_mask": bias.to(x.dtype)} if mask == "float" else {}
        if kernel == "default":
            y = F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([getattr(SDPBackend, kernel)]):
                y = F.scaled_dot_product_attention(q, k, v, **kw)
        return y.transpose(1, 2).reshape(b, t, -1)
    return f


def _run(f, x, grad):
    x = x.detach().requires_grad_(True)
    out = f(x)
    (gx,) = torch.autograd.grad(out, x, grad.to(out.dtype))
    return out, gx


@pytest.mark.parametrize("computed", ["input_views", "sliced_projection", "per_head_product"])
@pytest.mark.parametrize("mask", ["none", "causal", "float"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_sdpa_gradients(device, compile_fn, kernel, mask, computed):
    if device == "cpu" and kernel != "default":
        pytest.skip("the CPU has one sdpa kernel")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(2, 32, 3 * 4 * 16, device=device)
    bias = torch.randn(32, 32, device=device)
    grad = torch.randn(2, 32, 4 * 16, device=device)
    f = _attention(kernel, mask, bias, computed)
    try:
        expected = _run(f, x.to(dtype), grad)
    except RuntimeError as exc:
        if "No available kernel" in str(exc):
            pytest.skip(f"{kernel} does not take this case")
        raise
    reference = _run(_attention("MATH", mask, bias.double(), computed), x.double(), grad)
    torch._dynamo.reset()
    actual = _run(compile_fn(f), x.to(dtype), grad)
    assert_accurate(actual, expected, reference, what="(output, input grad)")


def _train_step_grads(model, x):
    model.zero_grad(set_to_none=True)
    out = model(x)
    out = out[0] if isinstance(out, tuple) else out
    out.square().mean().backward()
    return out.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("which", ["multihead_attention", "transformer_encoder_layer"])
def test_attention_modules_train_like_eager(device, compile_fn, which):
    torch.manual_seed(0)
    if which == "multihead_attention":
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.att = nn.MultiheadAttention(32, 4, batch_first=True)

            def forward(self, x):
                return self.att(x, x, x, need_weights=False)[0]
        model = M()
    else:
        model = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = model.to(device)
    x = torch.randn(2, 16, 32, device=device)
    expected = _train_step_grads(model, x)
    reference = _train_step_grads(to_float64(model), x.double())
    actual = _train_step_grads(compile_fn(model), x)
    assert_accurate(actual, expected, reference, what="(output, parameter grads)")
