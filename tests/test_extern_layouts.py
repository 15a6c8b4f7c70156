"""ATen calls inside a compiled graph get their inputs in the traced layouts, and their results are
read with the strides they really have (a ConvNeXt block read a convolution's output with the wrong
strides: outputs unrelated to eager's)."""
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from smelt.runtime import extern_layout


@pytest.fixture(autouse=True)
def _report_every_copy():
    extern_layout._reported.clear()  # each test sees the first copy of each op logged


class LayerNorm2d(nn.LayerNorm):
    """timm's: a layer norm over channels of an NCHW tensor, through two permutes."""

    def forward(self, x):
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


@pytest.mark.parametrize("stride", [1, 2])
def test_convolution_of_a_permuted_layer_norm(device, compile_fn, assert_close, stride, caplog):
    torch.manual_seed(0)
    model = nn.Sequential(LayerNorm2d(40), nn.Conv2d(40, 80, 2, stride=stride), LayerNorm2d(80)).to(device).eval()
    x = torch.randn(2, 40, 16, 16, device=device)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        assert_close(compile_fn(model)(x), model(x), atol=1e-4, rtol=1e-4)
    # The convolution got its input channels-last, as traced: its result needed no copy.
    assert "returned strides" not in caplog.text


def test_extern_inputs_of_every_dense_layout(device, compile_fn, assert_close, caplog):
    """Channels-last, transposed and permuted producers feeding convolutions and a matmul."""
    w = torch.randn(8, 6, 3, 3, device=device)

    def f(x, y):
        a = F.conv2d((x * 2).contiguous(memory_format=torch.channels_last), w)
        b = F.conv2d((x + 1).permute(0, 1, 3, 2), w)
        c = (y.exp()).t() @ y
        return a.relu() + b.transpose(2, 3), c.sum(0)

    x = torch.randn(2, 6, 9, 9, device=device)
    y = torch.randn(5, 7, device=device)
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        assert_close(compile_fn(f)(x, y), f(x, y), atol=1e-4, rtol=1e-4)
    assert "returned strides" not in caplog.text


@torch.library.custom_op("smelt_test::layout_liar", mutates_args=())
def layout_liar(x: torch.Tensor) -> torch.Tensor:
    return x.clone(memory_format=torch.contiguous_format) * 3


@layout_liar.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.channels_last)


def test_a_result_in_another_layout_than_traced_is_copied_not_misread(device, compile_fn, assert_close, caplog):
    """An op whose traced result is channels-last but whose kernel returns contiguous memory: the
    kernels after it must still read the right elements (the wrapper copies, and says so once)."""
    def f(x):
        return torch.ops.smelt_test.layout_liar(x + 1) + 1

    x = torch.randn(2, 3, 4, 5, device=device)
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        actual = compile_fn(f)(x)
    assert_close(actual, f(x))


@torch.library.custom_op("smelt_test::pair_liar", mutates_args=())
def pair_liar(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(memory_format=torch.contiguous_format) * 2, x.sum(1)


@pair_liar.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.channels_last), x.sum(1)


def test_each_result_of_a_several_output_op_is_checked(device, compile_fn, assert_close):
    def f(x):
        a, b = torch.ops.smelt_test.pair_liar(x.exp())
        return a + 1, b * 2

    x = torch.randn(2, 3, 4, 5, device=device)
    assert_close(compile_fn(f)(x), f(x))


def test_a_strided_view_of_a_computed_value_is_handed_to_aten_as_that_view(device, compile_fn, assert_close):
    """q, k and v sliced from one computed projection, as attention layers do: ATen gets views of
    the projection (its strides as traced), not dense copies."""
    def f(x, w):
        q, k = (x * 2).chunk(2, dim=-1)
        return torch.bmm(q.transpose(1, 2), k) @ w

    x = torch.randn(3, 8, 12, device=device)
    w = torch.randn(6, 5, device=device)
    assert_close(compile_fn(f)(x, w), f(x, w), atol=1e-4, rtol=1e-4)


def test_dynamic_sizes_keep_the_traced_layout_of_an_extern_input(device, compile_fn, assert_close, caplog):
    """Llama's attention under dynamic=True: q is a matmul's output viewed per head and transposed
    (dense, with symbolic strides); the CPU attention kernel's output layout follows its input's."""
    torch.manual_seed(0)
    w = torch.randn(32, 32, device=device)

    def f(x):
        b, s, _ = x.shape
        q = (x @ w).view(b, s, -1, 8).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q.sin(), q, is_causal=True)
        return o.transpose(1, 2).reshape(b, s, -1)

    compiled = compile_fn(f, dynamic=True)
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        for s in (6, 11):
            x = torch.randn(2, s, 32, device=device)
            assert_close(compiled(x), f(x), atol=1e-4, rtol=1e-4)
    assert "returned strides" not in caplog.text


def test_a_result_in_another_layout_is_caught_under_dynamic_sizes(device, compile_fn, assert_close):
    def f(x):
        return torch.ops.smelt_test.layout_liar(x + 1) + 1

    compiled = compile_fn(f, dynamic=True)
    for n in (4, 7):
        x = torch.randn(2, 3, n, 5, device=device)
        assert_close(compiled(x), f(x))


@torch.library.custom_op("smelt_test::strides_of", mutates_args=())
def _strides_of(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(x.stride()), device=x.device)


@_strides_of.register_fake
def _(x):
    return torch.empty(x.dim(), dtype=torch.int64, device=x.device)


def test_dynamic_sizes_keep_gapped_and_expanded_strides_of_an_extern_input(device, compile_fn):
    # CUDA's efficient attention pads its bias's rows to a multiple of 8, slices them back and
    # expands them over the heads: under dynamic=True the row stride is s - Mod(s, 8) + 8, and
    # smelt copied the view into dense memory (a view whose strides hold Mod was not seen as one),
    # which the kernel refused ("attn_bias is not correctly aligned", GPT-2 on the H100).
    def fn(m):
        s = m.size(-1)
        bias = F.pad(m * 2, (0, 8 - s % 8))[..., :s]
        return torch.ops.smelt_test.strides_of(bias), torch.ops.smelt_test.strides_of(bias[:, None].expand(-1, 2, -1, -1))
    compiled = compile_fn(fn, dynamic=True)
    for s in (6, 11, 13):
        m = torch.randn(2, s, s, device=device)
        row = s - s % 8 + 8
        expected = ([s * row, row, 1], [s * row, 0, row, 1])
        assert [t.tolist() for t in compiled(m)] == [t.tolist() for t in fn(m)] == list(expected)
