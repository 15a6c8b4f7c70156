"""Whisper's attention on CUDA: the head-major copies of its query, key, value and output are
dropped (lowering/fx_clones.py) and the values are eager's, in inference and in training (where the
copies stay, saved for the backward). tests/test_attention_copies.py checks the graph on the CPU."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Attention(torch.nn.Module):
    def __init__(self, width=384, heads=6, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width, bias=bias) for bias in (True, False, True, True))

    def forward(self, x):
        b, t, c = x.shape
        shape = (b, t, self.heads, c // self.heads)
        q = (self.q(x) * 0.125).view(shape).transpose(1, 2).contiguous()
        k = self.k(x).view(shape).transpose(1, 2).contiguous()
        v = self.v(x).view(shape).transpose(1, 2).contiguous()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=1.0)
        return self.o(out.transpose(1, 2).contiguous().reshape(b, t, c)) + x


@pytest.mark.parametrize("causal", [False, True])
def test_whisper_attention_without_its_copies(causal, compile_fn, assert_close, observe):
    torch.manual_seed(0)
    model = Attention(causal=causal).cuda().to(torch.bfloat16)
    x = torch.randn(4, 300, 384, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        observe.reset()
        actual = compile_fn(model)(x)
        again = compile_fn(model)(x + 1)
        expected_again = model(x + 1)
    assert_close(actual, expected, atol=2e-2, rtol=2e-2)
    assert_close(again, expected_again, atol=2e-2, rtol=2e-2)
    source = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
    assert "_scaled_dot_product" in source, source[:3000]
    kernels = [name for g in observe.compiled_graphs() for name in g.kernel_names]
    # What is left besides the products: the query's scale and the residual add (none of the copies).
    assert len(kernels) <= 2 and not any("clone" in name for name in kernels), kernels


def test_whisper_attention_trains_with_eagers_gradients(compile_fn, assert_close):
    torch.manual_seed(0)
    model = Attention().cuda().to(torch.bfloat16)
    x = torch.randn(2, 128, 384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    model(x).float().square().mean().backward()
    want = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    compile_fn(model)(x).float().square().mean().backward()
    got = [p.grad for p in model.parameters()] + [x.grad]
    for g, w in zip(got, want):
        assert_close(g, w, atol=5e-2, rtol=5e-2)
