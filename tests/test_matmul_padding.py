"""Matrix products with misaligned rows run on zero-padded rows (lowering/matmul_padding.py): the
values, gradients and strides the caller sees are eager's."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import smelt.config
from smelt.lowering import matmul_padding


@pytest.fixture(autouse=True)
def _every_product(monkeypatch):
    monkeypatch.setattr(matmul_padding, "MIN_MACS", 0)  # the tests' products are small
    with smelt.config.override(matmul_padding="on"):
        yield


def _wrappers(observe) -> str:
    return "\n".join(g.wrapper_source for g in observe.compiled_graphs())


def test_language_model_head_inference(device, compile_fn, assert_close, observe):
    torch.manual_seed(0)
    vocab, dim = 37, 16  # float32 rows align to 4 elements: 37 pads to 40
    emb = torch.randn(vocab, dim, device=device)
    h = torch.randn(6, dim, device=device)

    def head(h, emb):
        logits = h @ emb.t()
        return logits, logits.softmax(-1)

    actual = compile_fn(head)(h, emb)
    expected = head(h, emb)
    for a, e in zip(actual, expected):
        assert_close(a, e, atol=1e-5, rtol=1e-5)
        assert a.stride() == e.stride()
    assert "(40, 1)" in _wrappers(observe)  # the product's padded rows


def test_tied_head_training_step(device, compile_fn, assert_close, observe):
    """GPT-2's shape: tied embedding and head, cross-entropy, every gradient."""
    torch.manual_seed(0)
    model = nn.ModuleDict(dict(emb=nn.Embedding(37, 16), proj=nn.Linear(16, 16))).to(device)
    ids = torch.randint(0, 37, (3, 5), device=device)
    labels = torch.randint(0, 37, (3, 5), device=device)

    def step(ids, labels):
        h = torch.tanh(model["proj"](model["emb"](ids)))
        logits = h @ model["emb"].weight.t()
        return F.cross_entropy(logits.view(-1, 37), labels.view(-1)), logits

    loss, logits = step(ids, labels)
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss_c, logits_c = compile_fn(step)(ids, labels)
    loss_c.backward()
    assert_close(loss_c, loss, atol=1e-5, rtol=1e-5)
    assert logits_c.stride() == logits.stride()
    for name, p in model.named_parameters():
        assert_close(p.grad, expected[name], atol=1e-5, rtol=1e-5)
    assert "(40, 1)" in _wrappers(observe)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_batched_products_of_odd_widths(device, compile_fn, assert_close, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(20, 13).to(device=device, dtype=dtype)
    x = torch.randn(4, 7, 20, device=device, dtype=dtype)
    y = torch.randn(4, 13, 11, device=device, dtype=dtype)

    def f(x, y):
        z = torch.relu(linear(x))  # addmm, N = 13
        return torch.bmm(z, y) * 2, z  # bmm, K = 13, N = 11

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
    with torch.no_grad():
        actual, expected = compile_fn(f)(x, y), f(x, y)
    for a, e in zip(actual, expected):
        assert_close(a, e, **tol)
        assert a.stride() == e.stride()
