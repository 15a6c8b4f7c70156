"""Small 1x1 convolutions as reductions in smelt's kernels (lowering/small_products.py): a
squeeze-excite gate's two products join the kernels around them, with eager's values and strides;
a product over the limit, a symbolic one, and the setting off stay library calls."""
import pytest
import torch
import torch.nn as nn

import smelt.config


@pytest.fixture(autouse=True)
def _no_tf32():
    # Eager's cuDNN products run in TF32 by default (1e-3 off); smelt's reductions are float32's.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


class SqueezeExcite(nn.Module):
    """timm's form: mean over the image, reduce, SiLU, expand, sigmoid gate."""

    def __init__(self, c=20, rd=5, bias=True):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, rd, 1, bias=bias), nn.Conv2d(rd, c, 1, bias=bias)

    def forward(self, x):
        s = self.expand(torch.nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(s)


def _library_calls(observe) -> int:
    wrappers = "\n".join(g.wrapper_source for g in observe.compiled_graphs())
    return sum(wrappers.count(call) for call in ("torch.mm(", "torch.convolution(", "torch.addmm("))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("channels_last", [True, False])
def test_a_squeeze_excite_gate_runs_in_kernels_with_eagers_values(device, compile_fn, assert_close, observe, dtype,
                                                                 bias, channels_last):
    torch.manual_seed(0)
    model = SqueezeExcite(bias=bias).to(device, dtype).eval()
    x = torch.randn(3, 20, 5, 7, device=device, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(small_products="on"):
        actual = compile_fn(model)(x)
    expected = model(x)
    tolerance = {torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    assert_close(actual, expected, atol=tolerance, rtol=tolerance)
    assert actual.stride() == expected.stride()
    assert _library_calls(observe) == 0


@pytest.mark.parametrize("bias", [True, False])
def test_a_small_1x1_convolution_over_an_image_keeps_eagers_strides(device, compile_fn, assert_close, observe, bias):
    # The sums are laid out as eager's channels-last result: without a bias, one kernel (a row-major
    # sum needed a transposing copy after it). The bias is still a second kernel over an image
    # (not yet fused into the reduction's channels-last stores): why "auto" takes pooled inputs only.
    conv = nn.Conv2d(6, 10, 1, bias=bias).to(device).eval()
    x = torch.randn(2, 6, 5, 3, device=device).to(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(small_products="on"):
        actual = compile_fn(conv)(x)
    expected = conv(x)
    assert_close(actual, expected)
    assert actual.stride() == expected.stride()
    assert _library_calls(observe) == 0
    assert sum(len(g.kernel_sources) for g in observe.compiled_graphs()) == (2 if bias else 1)


@pytest.mark.parametrize("setting, shape, calls", [
    ("off", (2, 8, 1, 1), 1),
    ("auto", (2, 8, 3, 3), 1),  # over an image only when asked for
    ("auto", (2, 8, 1, 1), 0 if "triton" in smelt.config.current().cpu_backend else 1),  # the GPU's Target's
    ("on", (2, 64, 32, 32), 1),  # 2 x 32 x 32 x 64 x 64 = 8.4M multiply-adds: over the limit
    ("on", (2, 8, 3, 3), 0),
])
def test_products_over_the_limit_or_switched_off_stay_library_calls(device, compile_fn, assert_close, observe, setting,
                                                                    shape, calls):
    conv = nn.Conv2d(shape[1], 64, 1).to(device).eval()
    x = torch.randn(*shape, device=device)
    with torch.no_grad(), smelt.config.override(small_products=setting):
        actual = compile_fn(conv)(x)
    assert_close(actual, conv(x), atol=1e-4, rtol=1e-4)
    assert _library_calls(observe) == calls


def test_convolutions_that_are_not_1x1_products_are_left_alone(device, compile_fn, assert_close, observe):
    convs = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1, stride=2), nn.Conv2d(8, 8, 1, groups=2),
                           nn.Conv2d(8, 8, 1, padding=1), nn.Conv2d(8, 8, 1, dilation=2)]).to(device).eval()

    def run(x):
        return [conv(x) for conv in convs]
    x = torch.randn(2, 8, 5, 5, device=device)
    with torch.no_grad(), smelt.config.override(small_products="on", depthwise_kernels="off"):
        actual = compile_fn(run)(x)
    assert_close(actual, run(x), atol=1e-4, rtol=1e-4)
    assert _library_calls(observe) == len(convs)


def test_a_symbolic_batch_stays_a_library_call(device, compile_fn, assert_close, observe):
    # No bound on the work: the batch could be any size.
    model = SqueezeExcite().to(device).eval()
    compiled = compile_fn(model, dynamic=True)
    with torch.no_grad(), smelt.config.override(small_products="on"):
        for batch in (3, 5):
            x = torch.randn(batch, 20, 4, 4, device=device)
            assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert _library_calls(observe) >= 2


def test_a_squeeze_excite_gate_trains_to_eagers_gradients(device, compile_fn, assert_close):
    # The forward's products are reductions; the backward's convolution_backward stays ATen's.
    torch.manual_seed(0)
    model = SqueezeExcite()
    compiled_model = SqueezeExcite()
    compiled_model.load_state_dict(model.state_dict())
    model, compiled_model = model.to(device), compiled_model.to(device)
    x = torch.randn(3, 20, 5, 7, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with smelt.config.override(small_products="on"):
        out = compile_fn(compiled_model)(x2)
        out.square().sum().backward()
    expected = model(x)
    expected.square().sum().backward()
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert_close(x2.grad, x.grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(compiled_model.parameters(), model.parameters()):
        assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.smelt_only
def test_a_frozen_squeeze_excite_gate_sees_its_weights_change(device, assert_close):
    # Under frozen weights, the weight's casts run in a prologue; the products read what it made.
    torch.manual_seed(0)
    model = SqueezeExcite().to(device, torch.bfloat16).eval()
    x = torch.randn(2, 20, 4, 4, device=device, dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="smelt", options={"freeze_weights": True, "small_products": "on"})
    with torch.no_grad():
        assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)
        model.reduce.weight.mul_(-2)
        model.expand.bias.add_(1)
        assert_close(compiled(x), model(x), atol=2e-2, rtol=2e-2)


def test_the_products_producer_runs_once_per_element(device, compile_fn, assert_close, observe):
    # Each input value is read once per output channel: a GELU before the product, inlined into its
    # loads, would run 16 times an element. It is stored first; the reduction loads it.
    from conftest import inspects_triton_kernels
    inspects_triton_kernels()
    conv = nn.Conv2d(8, 16, 1).to(device).eval()
    y = torch.randn(2, 8, 3, 3, device=device)
    with torch.no_grad(), smelt.config.override(small_products="on"):
        actual = compile_fn(lambda y: conv(torch.nn.functional.gelu(y)))(y)
    assert_close(actual, conv(torch.nn.functional.gelu(y)), atol=1e-5, rtol=1e-5)
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    reducing = [s for s in sources if "tl.reduce(" in s or "tl.sum(" in s]
    assert reducing and not any("erf" in s for s in reducing), sources
