"""Convolutions through other library calls (lowering/convolution_calls.py). 1x1 ones over channels-last
activations as matrix products:
the same values as eager's convolutions, the output in eager's strides, and only the convolutions the
product equals are replaced. Small ones would be reductions (tests/test_small_products.py): off here."""
import pytest
import torch
import torch.nn as nn

import smelt.config


class PointwiseBlock(nn.Module):
    """An inverted residual's 1x1 expand (biased) and project (no bias) around a 3x3 depthwise."""

    def __init__(self, c=16):
        super().__init__()
        self.expand, self.norm = nn.Conv2d(c, 4 * c, 1), nn.BatchNorm2d(4 * c)
        self.depthwise = nn.Conv2d(4 * c, 4 * c, 3, padding=1, groups=4 * c, bias=False)
        self.project = nn.Conv2d(4 * c, c, 1, bias=False)

    def forward(self, x):
        return x + self.project(self.depthwise(torch.relu(self.norm(self.expand(x)))))


def _products_and_convolutions(observe) -> tuple[int, int]:
    wrappers = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
    return wrappers.count("torch.mm("), wrappers.count("torch.convolution(")


@pytest.mark.parametrize("setting", ["on", "off"])
def test_a_mobile_block_matches_eager_with_its_1x1_convolutions_as_products(device, compile_fn, assert_close,
                                                                             observe, setting):
    torch.manual_seed(0)
    model = PointwiseBlock().to(device, torch.bfloat16).eval()
    x = torch.randn(2, 16, 7, 9, device=device, dtype=torch.bfloat16)
    with torch.no_grad(), smelt.config.override(small_products="off", pointwise_convolutions=setting, channels_last="on",
                                                depthwise_kernels="off"):
        actual = compile_fn(model)(x)
    expected = model(x)
    assert_close(actual, expected, atol=3e-2, rtol=3e-2)
    assert actual.stride() == expected.stride()
    # The 1x1 expand and project become products; the depthwise stays cuDNN's / oneDNN's (its setting off).
    assert _products_and_convolutions(observe) == ((2, 1) if setting == "on" else (0, 3))


@pytest.mark.parametrize("conv, dtype", [
    (nn.Conv2d(8, 16, 1, stride=2), torch.bfloat16), (nn.Conv2d(8, 16, 1, groups=2), torch.bfloat16),
    (nn.Conv2d(8, 16, 1, padding=1), torch.bfloat16), (nn.Conv2d(8, 16, 3, padding=1), torch.bfloat16),
], ids=["stride_2", "groups_2", "padded", "3x3"])
def test_convolutions_a_product_does_not_equal_stay_convolutions(device, compile_fn, assert_close, observe, conv,
                                                                 dtype):
    conv = conv.to(device, dtype).eval()
    x = torch.randn(2, 8, 6, 6, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(small_products="off", pointwise_convolutions="on", channels_last="on"):
        actual = compile_fn(conv)(x)
    assert_close(actual, conv(x), atol=3e-2, rtol=3e-2)
    assert _products_and_convolutions(observe) == (0, 1)


def test_a_returned_1x1_convolution_over_a_channels_last_input_keeps_eagers_strides(device, compile_fn,
                                                                                     assert_close, observe):
    conv = nn.Conv2d(8, 12, 1).to(device, torch.bfloat16).eval()
    x = torch.randn(3, 8, 5, 4, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(small_products="off", pointwise_convolutions="on", channels_last="on"):
        actual = compile_fn(conv)(x)
    expected = conv(x)
    assert_close(actual, expected, atol=3e-2, rtol=3e-2)
    assert actual.stride() == expected.stride()
    assert _products_and_convolutions(observe) == (1, 0)


def test_a_squeeze_excite_convolution_over_one_position_is_a_product(device, compile_fn, assert_close, observe):
    """Over a 1x1 image (a squeeze-and-excite gate's pooled input) the activation's strides on its unit
    dims are anything: the product reads its [N, C] rows all the same."""
    conv = nn.Conv2d(16, 4, 1).to(device, torch.bfloat16).eval()
    x = torch.randn(3, 16, 6, 6, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)

    def gate(x):
        return torch.sigmoid(conv(x.mean((2, 3), keepdim=True)))
    with torch.no_grad(), smelt.config.override(small_products="off", pointwise_convolutions="on", channels_last="on"):
        actual = compile_fn(gate)(x)
    expected = gate(x)
    assert_close(actual, expected, atol=3e-2, rtol=3e-2)
    assert _products_and_convolutions(observe) == (1, 0)


def test_float32_is_a_product_on_the_cpu_only(device, compile_fn, assert_close, observe):
    """cuDNN may take TF32 for a float32 convolution under its own switch, cuBLAS for a product under
    another: on CUDA float32 convolutions stay convolutions."""
    conv = nn.Conv2d(8, 16, 1).to(device).eval()
    x = torch.randn(2, 8, 6, 6, device=device).to(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(small_products="off", pointwise_convolutions="on", channels_last="on"):
        actual = compile_fn(conv)(x)
    assert_close(actual, conv(x), atol=1e-4, rtol=1e-4)
    assert _products_and_convolutions(observe) == ((1, 0) if device == "cpu" else (0, 1))


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 16, 7, stride=2, padding=3), nn.BatchNorm2d(16)
        self.body = nn.Conv2d(16, 16, 3, padding=2, dilation=2, bias=False)
        self.depthwise = nn.Conv2d(16, 16, 3, groups=16)

    def forward(self, x):
        return self.depthwise(self.body(torch.relu(self.norm(self.stem(x)))))


@pytest.mark.parametrize("freeze", [False, True])
def test_packed_cpu_convolutions_match_eager_and_see_a_weight_changed_in_place(device, compile_fn, assert_close,
                                                                                observe, freeze):
    """runtime/packed_convolution.py: oneDNN with the weight in its blocked layout, packed each call or, with
    frozen weights, kept while the weight's version stands."""
    if device != "cpu":
        pytest.skip("float32 CPU convolutions only")
    torch.manual_seed(0)
    model = _ConvNet().eval()
    x = torch.randn(2, 3, 20, 20)
    with torch.no_grad(), smelt.config.override(packed_convolutions="on", freeze_weights=freeze):
        compiled = compile_fn(model)
        for _ in range(2):
            actual = compiled(x)
            assert_close(actual, model(x), atol=1e-4, rtol=1e-4)
            assert actual.stride() == model(x).stride()
            model.body.weight.mul_(-0.5)  # in place: the next call must see it
    wrappers = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
    assert wrappers.count("packed_convolution") >= 3 and "torch.convolution(" not in wrappers
