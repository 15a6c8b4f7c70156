"""Whole (small) models: forward passes compiled with the backend vs eager."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOL = dict(atol=1e-4, rtol=1e-4)


def _mlp(device):
    return nn.Sequential(
        nn.Linear(33, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.GELU(),
        nn.Linear(64, 10),
    ).to(device)


def test_mlp_forward_matches_eager(device, compile_fn, assert_close):
    model = _mlp(device).eval()
    x = torch.randn(17, 33, device=device)
    with torch.no_grad():
        expected = model(x)
        actual = compile_fn(model)(x)
    assert_close(actual, expected, **TOL)


def test_mlp_forward_with_grad_enabled(device, compile_fn, assert_close):
    model = _mlp(device)
    x = torch.randn(17, 33, device=device)
    expected = model(x)
    actual = compile_fn(model)(x)
    assert actual.requires_grad
    assert_close(actual.detach(), expected.detach(), **TOL)


def test_mlp_forward_repeated_calls_new_inputs(device, compile_fn, assert_close):
    model = _mlp(device).eval()
    compiled = compile_fn(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(17, 33, device=device)
            assert_close(compiled(x), model(x), **TOL)


class TinyAttentionBlock(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def test_attention_block_forward_matches_eager(device, compile_fn, assert_close):
    model = TinyAttentionBlock().to(device).eval()
    x = torch.randn(2, 17, 32, device=device)
    with torch.no_grad():
        expected = model(x)
        actual = compile_fn(model)(x)
    assert_close(actual, expected, **TOL)


class TinyConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(x.mean(dim=(2, 3)))


def test_convnet_with_batchnorm_eval_matches_eager(device, compile_fn, assert_close):
    model = TinyConvNet().to(device)
    with torch.no_grad():
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    x = torch.randn(2, 3, 9, 9, device=device)
    with torch.no_grad():
        expected = model(x)
        actual = compile_fn(model)(x)
    assert_close(actual, expected, **TOL)
