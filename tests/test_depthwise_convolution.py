"""Depthwise convolutions lowered to smelt kernels (lowering/depthwise_convolution.py): values
against eager for every window shape the mobile nets and ConvNeXt use (strides, padding past the
window, dilation, channel multipliers, 1-D and 3-D), fused with what follows, and the cases that
stay in ATen."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import smelt.config
import smelt.pipeline
from conftest import inspects_triton_kernels


@pytest.fixture(autouse=True)
def _no_tf32():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


def _kernels(observe) -> list[str]:
    return [k for g in observe.compiled_graphs() for k in g.kernel_names]


def _externs(observe) -> str:
    """The wrapper lines that call ATen (not the comments naming each kernel's source ops)."""
    return "\n".join(line for g in observe.compiled_graphs() for line in g.wrapper_source.splitlines()
                     if "(" in line and not line.lstrip().startswith("#"))


CASES = [
    # (input shape, channels out, kernel, stride, padding, dilation, bias)
    ((2, 8, 13, 11), 8, 7, 1, 3, 1, True),  # ConvNeXt
    ((2, 8, 12, 12), 8, 3, 2, 1, 1, False),  # MobileNet's strided 3x3
    ((1, 6, 9, 10), 6, 5, 2, 2, 1, True),  # EfficientNet's 5x5
    ((2, 4, 10, 9), 8, 3, 1, 1, 1, True),  # channel multiplier 2
    ((1, 4, 11, 11), 4, 3, 1, 4, 2, False),  # dilation, padding past the window's reach
    ((1, 4, 7, 12), 4, (1, 5), (2, 1), (0, 2), 1, True),  # a rectangular window
]


@pytest.mark.smelt_only
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_depthwise_matches_eager(device, compile_fn, assert_close, observe, case, layout):
    shape, out_channels, kernel, stride, padding, dilation, bias = case
    torch.manual_seed(0)
    x = torch.randn(shape, device=device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    conv = nn.Conv2d(shape[1], out_channels, kernel, stride, padding, dilation, groups=shape[1], bias=bias).to(device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(conv)(x)
        expected = conv(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert actual.stride() == expected.stride()
    assert "torch.convolution(" not in _externs(observe)


@pytest.mark.smelt_only
def test_depthwise_fuses_with_norm_and_activation(device, compile_fn, assert_close, observe):
    """A mobile net's block: depthwise convolution, batch norm, hard-swish, as one kernel."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16),
                          nn.Hardswish()).to(device).eval()
    with torch.no_grad():
        block[1].running_mean.normal_()
        block[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 16, 14, 14, device=device).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(block)(x)
        expected = block(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert len(_kernels(observe)) == 1, _kernels(observe)


@pytest.mark.smelt_only
@pytest.mark.parametrize("reads", ["once", "twice"])
def test_the_norm_and_activation_before_is_computed_once_not_per_tap(device, compile_fn, assert_close, observe,
                                                                     reads):
    """EfficientNet's block: batch norm and SiLU, then a 3x3 depthwise convolution and a mean (the
    squeeze). The activation is cheap enough that a reader would recompute it, but the window reads
    each element 9 times: it is stored once, and the convolution's kernel loads it (the lowering had
    realized a copy and still loaded through the loop nest, 9 SiLUs an output element). Read a
    second time (a residual), it is stored for both readers alike."""
    torch.manual_seed(0)
    scale, shift = torch.randn(1, 16, 1, 1, device=device), torch.randn(1, 16, 1, 1, device=device)
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False).to(device)

    def block(x):
        a = F.silu(x * scale + shift)
        y = conv(a)
        return (y.mean((2, 3)), y + a) if reads == "twice" else y.mean((2, 3))

    x = torch.randn(2, 16, 10, 10, device=device).contiguous(memory_format=torch.channels_last)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(block)(x)
        expected = block(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    names = _kernels(observe)
    assert "torch.convolution(" not in _externs(observe)
    assert any("silu" in n and "convolution" not in n for n in names), names  # stored by a kernel of its own
    inspects_triton_kernels()
    (source,) = [s for g in observe.compiled_graphs() for n, s in g.kernel_sources.items() if "convolution" in n]
    # One exp at most: the residual's reader may recompute its SiLU once an element, never per tap.
    assert source.count("exp(") <= (1 if reads == "twice" else 0), source


@pytest.mark.smelt_only
def test_convnext_block_stores_the_convolution_once(device, compile_fn, assert_close, observe):
    """ConvNeXt permutes the convolution's output before its layer norm, which reads it twice:
    the window is summed into memory once, not recomputed by each read."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c=16):
            super().__init__()
            self.dw, self.norm, self.fc = nn.Conv2d(c, c, 7, padding=3, groups=c), nn.LayerNorm(c), nn.Linear(c, c)

        def forward(self, x):
            return x + self.fc(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)

    block = Block().to(device).eval()
    x = torch.randn(2, 16, 9, 9, device=device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(block)(x)
        expected = block(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert "torch.convolution(" not in _externs(observe)
    inspects_triton_kernels()
    # 49 input and 49 weight loads, the bias and the norm's, and the residual's: not twice 98.
    loads = sum(s.count("tl.load") for g in observe.compiled_graphs() for s in g.kernel_sources.values())
    assert 98 <= loads < 120, loads


@pytest.mark.smelt_only
@pytest.mark.parametrize("dims", [1, 3])
def test_depthwise_in_one_and_three_dims(device, compile_fn, assert_close, observe, dims):
    torch.manual_seed(0)
    conv = (nn.Conv1d(6, 6, 5, padding=2, groups=6) if dims == 1
            else nn.Conv3d(4, 4, 3, stride=(1, 2, 2), padding=1, groups=4)).to(device)
    x = torch.randn((2, 6, 17) if dims == 1 else (1, 4, 5, 8, 8), device=device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(conv)(x)
        expected = conv(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert "torch.convolution(" not in _externs(observe)


@pytest.mark.smelt_only
def test_depthwise_half_floats_round_once(device, compile_fn, assert_close):
    """bf16 inputs are summed in float32 and rounded once: as close to a float64 answer as eager's."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 14, 14, device=device).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(32, 1, 7, 7, device=device).to(torch.bfloat16)
    b = torch.randn(32, device=device).to(torch.bfloat16)
    fn = lambda x, w, b: F.conv2d(x, w, b, padding=3, groups=32)  # noqa: E731
    with smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(fn)(x, w, b)
    exact = fn(x.double(), w.double(), b.double())
    eager_error = (fn(x, w, b).double() - exact).abs().max()
    assert (actual.double() - exact).abs().max() <= max(eager_error, 1e-2)


@pytest.mark.smelt_only
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_depthwise_training_gradients(device, compile_fn, assert_close, observe, case, layout):
    """The backward runs as kernels too (the input's gradient gathered over the windows, the weight's a
    reduction), but for a channel multiplier or dilation, which stay in ATen."""
    shape, out_channels, kernel, stride, padding, dilation, bias = case
    torch.manual_seed(0)
    conv = nn.Conv2d(shape[1], out_channels, kernel, stride, padding, dilation, groups=shape[1], bias=bias).to(device)
    x = torch.randn(shape, device=device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    with smelt.config.override(depthwise_kernels="on", depthwise_weight_gradient="reduction"):
        (compile_fn(conv)(x) * torch.linspace(-1, 1, 7, device=device).repeat(50)[:1]).sin().sum().backward()
    params = [x, conv.weight] + ([conv.bias] if bias else [])
    actual = [p.grad for p in params]
    for p in params:
        p.grad = None
    (conv(x) * torch.linspace(-1, 1, 7, device=device).repeat(50)[:1]).sin().sum().backward()
    for a, p in zip(actual, params):
        assert_close(a, p.grad, atol=1e-4, rtol=1e-4)
        assert a.stride() == p.grad.stride() or a.dim() < 4
    in_aten = out_channels != shape[1] or dilation != 1
    assert ("aten.convolution_backward.default(" in _externs(observe)) == in_aten


@pytest.mark.smelt_only
@pytest.mark.parametrize("case", [c for c in CASES if c[1] == c[0][1] and c[5] == 1],
                         ids=lambda c: f"{c[0]}-k{c[2]}-s{c[3]}-p{c[4]}")
@pytest.mark.parametrize("form", ["kernel", "library"])
def test_weight_gradient_forms(device, compile_fn, assert_close, observe, case, form):
    """The weight's gradient by smelt's Triton kernel (on CUDA, or in the Triton backend's
    interpreter) or by the library, the input's by smelt's gather, over channels-last input."""
    shape, out_channels, kernel, stride, padding, dilation, bias = case
    torch.manual_seed(0)
    conv = nn.Conv2d(shape[1], out_channels, kernel, stride, padding, dilation, groups=shape[1], bias=bias).to(device)
    x = torch.randn(shape, device=device).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    with smelt.config.override(depthwise_kernels="on", depthwise_weight_gradient=form):
        compile_fn(conv)(x).sin().sum().backward()
    actual = [x.grad, conv.weight.grad]
    x.grad = conv.weight.grad = None
    conv(x).sin().sum().backward()
    assert_close(actual, [x.grad, conv.weight.grad], atol=1e-4, rtol=1e-4)
    calls = _externs(observe)
    kernel_runs_here = device.startswith("cuda") or smelt.config.current().cpu_backend == "triton"
    assert ("depthwise_weight_gradient(" in calls) == (form == "kernel" and kernel_runs_here)
    # The library's call asks for the weight's gradient alone.
    assert ("aten.convolution_backward.default(" in calls) == (form == "library")
    assert form != "library" or "[False, True, False]" in calls


@pytest.mark.smelt_only
def test_the_weight_gradient_kernel_gives_way_where_it_does_not_apply(device, compile_fn, observe, backend):
    """Under SMELT_DEPTHWISE_WEIGHT_GRADIENT=kernel: float64 (the kernel sums in float32) and CPU
    graphs that are not the Triton backend's (its interpreter) take the reduction, at full precision."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False).to(device, torch.float64)
    x = torch.randn(2, 8, 9, 9, device=device, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    with smelt.config.override(depthwise_kernels="on", depthwise_weight_gradient="kernel"):
        compile_fn(conv)(x).sin().sum().backward()
    actual = conv.weight.grad
    exact = torch.autograd.grad(conv(x).sin().sum(), conv.weight)[0]
    assert actual.dtype == torch.float64
    torch.testing.assert_close(actual, exact, atol=1e-12, rtol=1e-12)
    assert "depthwise_weight_gradient(" not in _externs(observe)

    observe.reset()
    x32 = x.detach().float().requires_grad_(True)
    conv32 = nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False).to(device)
    with smelt.config.override(depthwise_kernels="on", depthwise_weight_gradient="kernel"):
        compile_fn(conv32)(x32).sin().sum().backward()
    taken = "depthwise_weight_gradient(" in _externs(observe)
    assert taken == (device.startswith("cuda") or smelt.config.current().cpu_backend == "triton")


@pytest.mark.smelt_only
@pytest.mark.parametrize("stride", [1, 2])
def test_strided_input_gradient_walks_channels_last_memory(device, compile_fn, observe, stride):
    """The input gradient's gather reads the output gradient at (h + p - k) // s: a stride-2 window's
    `C * (w // 2)` jumps C elements every two steps of w, not a broadcast. Counted as one, the kernel
    was tiled over (n, c, h) x w, every NHWC buffer strided, for the weight's sake (EfficientNet's
    first 5x5: 475 us on the H200). Its store must run along one of the tile's axes."""
    inspects_triton_kernels()
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 32, 5, stride, 2, groups=32, bias=False).to(device)
    x = torch.randn(2, 32, 14, 14, device=device).contiguous(memory_format=torch.channels_last).requires_grad_()
    with smelt.config.override(depthwise_kernels="on"):
        compile_fn(conv)(x).square().sum().backward()
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    walks = [line for s in sources for line in s.splitlines() if line.startswith(("# iterates", "# tiled"))]

    def iterates(source):  # (elements, the "# iterates" line)
        (line,) = [line for line in source.splitlines() if line.startswith("# iterates")]
        outer, inner = line.split()[2], line.split()[4].rstrip(";")
        return int(outer) * int(inner), line
    # The pointwise kernel over x's 2 * 32 * 14 * 14 elements.
    gathers = [s for s in sources if iterates(s)[0] == 12544 and "(reduction)" not in iterates(s)[1]
               and "convolution_backward" in s.splitlines()[0]]
    assert len(gathers) == 1, walks
    (stored,) = [line.split("stores: ")[1] for line in gathers[0].splitlines() if line.startswith("# iterates")]
    tiled = [line for line in gathers[0].splitlines() if line.startswith("# tiled:")]
    assert not tiled or stored in tiled[0].split("contiguous along")[1], walks


@pytest.mark.smelt_only
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("form", ["reduction", "kernel", "library"])
def test_depthwise_backward_half_floats_round_once(device, compile_fn, layout, form):
    """bfloat16 gradients accumulated in float32 and rounded once: within one rounding of float64's."""
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, 5, stride=2, padding=2, groups=16, bias=True).to(device, torch.bfloat16)
    x = torch.randn(4, 16, 15, 15, device=device, dtype=torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    dy = torch.randn(4, 16, 8, 8, device=device, dtype=torch.bfloat16)
    with smelt.config.override(depthwise_kernels="on", depthwise_weight_gradient=form):
        (compile_fn(conv)(x) * dy).sum().backward()
    actual = [x.grad, conv.weight.grad, conv.bias.grad]
    exact = torch.autograd.grad(F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), 2, 2, 1, 16),
                                [x, conv.weight, conv.bias], dy.double())
    for a, e in zip(actual, exact):
        assert a.dtype == torch.bfloat16
        # One bfloat16 rounding of the exact value: half an ulp (2**-9 relative), with float32's sum below it.
        assert ((a.double() - e).abs() <= e.abs() * 2 ** -8 + 1e-6).all()


@pytest.mark.smelt_only
@pytest.mark.parametrize("why", ["large window", "grouped, not depthwise", "setting off"])
def test_other_convolutions_stay_in_aten(device, compile_fn, assert_close, observe, why):
    torch.manual_seed(0)
    conv = {"large window": nn.Conv2d(4, 4, 9, padding=4, groups=4),
            "grouped, not depthwise": nn.Conv2d(8, 8, 3, padding=1, groups=4),
            "setting off": nn.Conv2d(4, 4, 3, padding=1, groups=4)}[why].to(device)
    x = torch.randn(1, conv.in_channels, 12, 12, device=device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="off" if why == "setting off" else "on"):
        actual = compile_fn(conv)(x)
        expected = conv(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert "torch.convolution(" in _externs(observe)


@pytest.mark.smelt_only
@pytest.mark.parametrize("kernel, lowered", [(3, True), (5, True), (7, False)])
def test_auto_takes_the_windows_the_target_asks_for(device, compile_fn, assert_close, observe, monkeypatch,
                                                    kernel, lowered):
    """"auto" lowers windows up to the Target's `depthwise_kernel_taps` (the GPU's: 5x5) and leaves larger ones to
    the library."""
    as_set = smelt.pipeline._as_set
    monkeypatch.setattr(smelt.pipeline, "_as_set",
                        lambda cfg, target: dataclasses.replace(as_set(cfg, target), depthwise_kernel_taps=25))
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4, kernel, padding=kernel // 2, groups=4).to(device)
    x = torch.randn(1, 4, 12, 12, device=device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="auto"):
        actual = compile_fn(conv)(x)
        expected = conv(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert ("torch.convolution(" in _externs(observe)) is not lowered


def test_auto_leaves_depthwise_to_the_library_under_cuda_graphs_and_off_two_dims():
    """A replay pays GPU time alone, where cuDNN's depthwise kernels are the faster: "auto" takes none then, nor
    windows of other than 2 dims (not measured), and "on" still does."""
    from smelt.lowering.extern_calls import _depthwise_taps
    from smelt.target import H100

    def taps(dims=2, backward=False, **settings):
        config = dataclasses.replace(smelt.config.current(), **settings)
        x = SimpleNamespace(get_size=lambda: [1] * (dims + 2), get_device=lambda: torch.device("cuda"))
        return _depthwise_taps(SimpleNamespace(config=config, target_for=lambda device_type: H100), x, backward)

    assert taps(depthwise_kernels="auto", cuda_graphs=False) == H100.depthwise_kernel_taps == 25
    assert taps(depthwise_kernels="auto", cuda_graphs=True) == 0
    assert taps(1, depthwise_kernels="auto", cuda_graphs=False) == 0  # 1-D and 3-D windows: not measured
    assert taps(depthwise_kernels="on", cuda_graphs=True) == 49
    assert taps(1, depthwise_kernels="on", cuda_graphs=False) == 49
    assert taps(depthwise_kernels="off", cuda_graphs=False) == 0
    # The backward: the input's gradient by smelt, the weight's by the library (target.py's measurements).
    assert taps(backward=True, depthwise_kernels="auto", cuda_graphs=False) == H100.depthwise_backward_kernel_taps == 25
    assert H100.depthwise_weight_gradient == "library"
    assert taps(backward=True, depthwise_kernels="auto", cuda_graphs=True) == 0
    assert taps(backward=True, depthwise_kernels="on", cuda_graphs=False) == 49


@pytest.mark.smelt_only
@pytest.mark.parametrize("kernel, fused", [(3, True), (5, False)])
def test_a_wide_window_is_not_summed_inside_a_reduction(device, compile_fn, assert_close, observe, kernel, fused):
    """A squeeze-excite mean over a depthwise convolution: a 3x3 window (19 loads an element here) joins the
    mean's kernel; a 5x5 one (51) keeps a pointwise kernel of its own, whose block shrinks by its loads, and the
    mean reads its output (scheduler/fusion.py's HEAVY_LOADS: fused, it compiled 5-8x slower for sm_90)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 16, kernel, padding=kernel // 2, groups=16).to(device)

    def block(x):
        y = F.hardswish(conv(x))
        return y * y.mean((2, 3), keepdim=True).sigmoid()

    x = torch.randn(2, 16, 12, 12, device=device)
    with torch.no_grad(), smelt.config.override(depthwise_kernels="on"):
        actual = compile_fn(block)(x)
        expected = block(x)
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    names = _kernels(observe)
    reductions = [n for n in names if "_per_" in n or "_red_" in n]
    assert any("convolution" in n for n in reductions) == fused, names
