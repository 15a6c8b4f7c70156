"""The backward of a depthwise convolution as smelt kernels: the input's gradient gathers, for each
input element, the few output windows that read it (as a pool's backward does), and fuses with the
kernels around it. The weight's gradient, a sum over batch and output positions of the gradient
times the input under each tap, takes one of three forms (Target.depthwise_weight_gradient): a
reduction in smelt's IR whose products are never stored, smelt's Triton kernel reading both
operands about once (runtime/depthwise_weight_gradient.py), or the library's call for it alone.

cuDNN builds a plan at the first call of each channels-last depthwise shape in a process, about
0.5 s for the whole backward (EfficientNet-B0's 12 shapes: 6.1-6.3 s on the H200, 4.6 s for the
weight's gradient alone; NCHW's native kernels 0.004 s; benchmarks/probes/conv_first_call.py), and
a warm start pays it again. Under "auto" the Target decides: on the GPU smelt's input gradient and
cuDNN's weight gradient, whose GPU time equals cuDNN's whole backward (target.py).
"""
from __future__ import annotations

import itertools
import logging

import torch

from ..ir import Pointwise, TensorBox, View, ops
from ..runtime import depthwise_weight_gradient  # noqa: F401  (registers smelt::depthwise_weight_gradient)
from ..symbolic import product, static_int, sympify
from .common import make_pointwise, upcast_half
from .depthwise_convolution import _stored
from .extern_nodes import make_extern
from . import onednn_weight_gradient
from .pooling import Window, _all, _expand, _index, _provable
from .reductions import make_reduction

log = logging.getLogger("smelt.lowering")


def depthwise_backward_windows(g, grad, x, weight, stride, padding, dilation, transposed, groups,
                               tap_limit: int) -> list[Window] | None:
    """The windows of a depthwise convolution's backward to lower here, or None (ATen runs it)."""
    in_size, w_size = x.get_size(), weight.get_size()
    n = len(in_size) - 2
    channels, out_channels = static_int(in_size[1]), static_int(w_size[0])
    taps = [static_int(s) for s in w_size[2:]]
    dilation = _expand(dilation, n)
    if transposed or n < 1 or channels is None or None in taps or static_int(w_size[1]) != 1 \
            or groups != channels:
        return None  # not a depthwise convolution (or sizes only known at run time)
    why = None
    if out_channels != channels:
        why = "a channel multiplier"  # each input channel's gradient would sum several outputs' windows
    elif any(int(d) != 1 for d in dilation):
        why = "dilation"
    elif product(taps) > tap_limit:
        why = f"a window of {product(taps)} elements (over {tap_limit})"
    if why is not None:
        log.debug("smelt: depthwise convolution backward of %s runs in ATen: %s", list(in_size), why)
        return None
    out_size = grad.get_size()[2:]
    return [Window(sympify(s), sympify(o), k, int(st), int(p), 1)
            for s, o, k, st, p in zip(in_size[2:], out_size, taps, _expand(stride, n), _expand(padding, n))]


def lower_depthwise_backward(g, grad, x, weight, windows: list[Window], output_mask) -> tuple:
    """(input gradient, weight gradient, bias gradient), None where output_mask asks for none; half
    floats accumulate in float32 and round once, as cuDNN does."""
    metas = g.out_meta
    grad_node, x_node, weight_node = g.node.args[:3]
    # Every tap reads the gradient (and the weight gradient the input): stored once, not recomputed per tap.
    grad = _stored(g, grad, grad_node)
    x = _stored(g, x, x_node)
    weight = _stored(g, weight, weight_node)
    compute = upcast_half(grad.get_dtype())
    results = [None, None, None]
    if output_mask[0]:
        results[0] = _input_gradient(g, grad, weight, x.get_size(), windows, compute, metas[0].dtype)
    if output_mask[1]:
        form = _weight_gradient_form(g, x, x_node, windows)
        if form == "kernel":
            results[1] = _weight_gradient_kernel(g, grad, x, windows, metas[1])
        elif form == "library":
            results[1] = _weight_gradient_in_library(g, grad, x, weight, windows, metas[1])
        else:
            results[1] = _weight_gradient(g, grad, x, windows, compute, metas[1].dtype,
                                          channels_last=_channels_innermost(x_node))
    if output_mask[2]:
        n = len(windows)
        total = make_reduction(g, grad, [0, *range(2, n + 2)], False, "sum", compute, compute)
        results[2] = make_pointwise(g, [total], lambda v: v, compute_dtype=compute, out_dtype=metas[2].dtype,
                                    size=total.get_size())
    return tuple(results)


def _input_gradient(g, grad, weight, input_size, windows: list[Window], compute, dtype) -> TensorBox:
    """d x[b, c, h] = sum over the windows o covering h of grad[b, c, o] * weight[c, 0, h - start(o)]."""
    load_grad, load_w = grad.make_loader(), weight.make_loader()
    n = len(windows)

    def element(index):
        batch, channel, hs = index[0], index[1], index[2:]
        total = None
        for combo in itertools.product(*(w.covering(h, need_reach=True) for w, h in zip(windows, hs))):
            outs = [o for o, _ in combo]
            taps = [h - w.start(o) for w, h, o in zip(windows, hs, outs)]

            def term(outs=outs, taps=taps):
                return ops.mul(ops.to_dtype(load_grad([batch, channel, *outs]), compute),
                               ops.to_dtype(load_w([channel, sympify(0), *taps]), compute))
            inside = _all([c for _, c in combo])
            value = term() if inside is None else ops.masked(inside, term, 0.0)
            total = value if total is None else ops.add(total, value)
        return ops.to_dtype(total, dtype)
    size = [sympify(s) for s in input_size]
    assert len(size) == n + 2
    return TensorBox.of_storage(Pointwise(grad.get_device(), dtype, element, size,
                                          g.origin | grad.origins | weight.origins))


def _weight_gradient(g, grad, x, windows: list[Window], compute, dtype, channels_last: bool) -> TensorBox:
    """d weight[c, 0, k] = sum over b and o of grad[b, c, o] * x[b, c, start(o) + k], reduced over the
    products [taps, b, outs, c] (channels-last: neighbouring outputs read neighbouring channels) or
    [c, taps, b, outs] (NCHW: each output reads along rows); the products are recomputed, never stored.
    A reduction per tap, all of one shape sharing the gradient's loads, was tried and measured (H200,
    RESULTS 2026-12-02, thirty-ninth session): EfficientNet's 5x5 138 -> 121 us, but at stride 1 the
    scheduler fused the input gradient's gather into its split partials, 485-510 us on MobileNetV3."""
    load_grad, load_x = grad.make_loader(), x.make_loader()
    n = len(windows)
    batch_size, channels = grad.get_size()[:2]
    taps_size = [sympify(w.length) for w in windows]
    outs_size = [w.out for w in windows]
    if channels_last:
        size = [*taps_size, batch_size, *outs_size, channels]

        def unpack(index):
            return index[-1], index[:n], index[n], index[n + 1:2 * n + 1]
        reduced = list(range(n, 2 * n + 1))
    else:
        size = [channels, *taps_size, batch_size, *outs_size]

        def unpack(index):
            return index[0], index[1:n + 1], index[n + 1], index[n + 2:]
        reduced = list(range(n + 1, 2 * n + 2))

    def product_element(index):
        channel, taps, batch, outs = unpack(index)
        pos = [w.position(o, k) for w, o, k in zip(windows, outs, taps)]
        inside = _all([_inside(w, o, k) for w, o, k in zip(windows, outs, taps)])

        def read():
            return ops.to_dtype(load_x([batch, channel, *pos]), compute)
        value = read() if inside is None else ops.masked(inside, read, 0.0)
        return ops.mul(ops.to_dtype(load_grad([batch, channel, *outs]), compute), value)
    products = TensorBox.of_storage(Pointwise(grad.get_device(), compute, product_element, size,
                                              g.origin | grad.origins | x.origins))
    total = make_reduction(g, products, reduced, False, "sum", compute, compute)

    def weight_index(index):  # [c, 0, *taps] -> the reduction's [*taps, c] or [c, *taps]
        channel, taps = index[0], list(index[2:])
        return [*taps, channel] if channels_last else [channel, *taps]
    weight_size = [channels, sympify(1), *taps_size]
    arranged = TensorBox(View(total.data, weight_size, weight_index, "weight gradient"))
    return make_pointwise(g, [arranged], lambda v: v, compute_dtype=compute, out_dtype=dtype, size=weight_size)


def _weight_gradient_form(g, x, x_node, windows: list[Window]) -> str:
    """"kernel", "library" or "reduction" (see config.depthwise_weight_gradient). The kernel gives
    way to the reduction where it does not apply, saying why."""
    setting = g.config.depthwise_weight_gradient if g.config is not None else "auto"
    device = x.get_device().type
    form = g.target_for(device).depthwise_weight_gradient if setting == "auto" else setting
    if form != "kernel":
        return form
    why = None
    if len(windows) != 2 or not _channels_innermost(x_node):
        why = "the kernel takes 2-D windows over channels-last input"
    elif x.get_dtype() not in (torch.float32, torch.float16, torch.bfloat16):
        why = f"the kernel sums in float32, short of {x.get_dtype()}"
    elif device != "cuda" and not (device == "cpu" and g.config is not None and g.config.cpu_backend == "triton"):
        # (The Triton backend's CPU graphs run their kernels in Triton's interpreter anyway, to test the GPU's.)
        why = f"the kernel is Triton's, and {device} tensors would run it in Triton's interpreter"
    if why is not None:
        log.debug("smelt: depthwise weight gradient of %s as a reduction: %s", list(x.get_size()), why)
        return "reduction"
    return form


def _weight_gradient_kernel(g, grad, x, windows: list[Window], meta) -> TensorBox:
    args = (grad, x, [w.length for w in windows], [w.stride for w in windows], [w.padding for w in windows], meta.dtype)
    return make_extern(g, torch.ops.smelt.depthwise_weight_gradient.default, args, {}, is_fallback=False, meta=meta)


def _weight_gradient_in_library(g, grad, x, weight, windows: list[Window], meta) -> TensorBox:
    """The library's weight gradient alone (cuDNN's), the input's gradient still smelt's kernel."""
    n = len(windows)
    args = (grad, x, weight, None, [w.stride for w in windows], [w.padding for w in windows], [1] * n, False,
            [0] * n, static_int(x.get_size()[1]), [False, True, False])
    if onednn_weight_gradient.faults(x, args[4], args[10]):
        return onednn_weight_gradient.weight_gradient(g, grad, x, weight, args[3:10], meta)
    return make_extern(g, torch.ops.aten.convolution_backward.default, args, {}, is_fallback=False,
                       meta=(None, meta, None))[1]


def _inside(window: Window, o, k):
    """Window.inside for a tap that is an index variable, not a number (None when always inside)."""
    pos = window.position(o, k)
    last = (window.out - 1) * window.stride - window.padding + window.length - 1
    return _all([ops.ge(_index(pos), ops.constant(0, torch.int64)) if window.padding > 0 else None,
                 None if _provable(sympify(last) < window.size) else ops.lt(_index(pos), _index(window.size))])


def _channels_innermost(node) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dim() > 2 and value.stride(1) == 1 and value.shape[1] > 1
