"""Ops that run in ATen: matrix products and convolutions by choice, anything unlowered as fallback."""
from __future__ import annotations

import logging
import operator

import torch

from ..ir import ExternKernel, Pointwise, StorageBox, TensorBox, View, ops
from ..ir.nodes import ComputedBuffer, InputBuffer
from ..ir.graph import origin_name
from .common import broadcast_loader, make_pointwise, upcast_half
from .depthwise_convolution import TAP_LIMIT, depthwise_windows, lower_depthwise
from .depthwise_convolution_backward import depthwise_backward_windows, lower_depthwise_backward
from .extern_nodes import make_extern
from .convolution_calls import is_packable_convolution, is_pointwise_convolution, lower_pointwise_convolution
from .input_writes import InputWrite
from . import onednn_weight_gradient, small_products
from .kernel_support import why_aten
from ..target import switched_on
from ..runtime import onednn_linear, packed_convolution, padded_product, short_attention  # noqa: F401  (register smelt's ops)
from .registry import lowering

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")


def fallback(g, op, args, kwargs):
    if not isinstance(op, torch._ops.OpOverload):
        raise NotImplementedError(f"smelt: cannot run {op} through ATen (not an ATen op overload)")
    name = origin_name(g.node)
    log.debug("smelt: no lowering for %s; it runs through its ATen kernel", name)
    g.fallback_ops.append(name)
    return make_extern(g, op, args, kwargs, is_fallback=True)


def device_copy(g, x, **kwargs):
    """A copy to another device (and maybe dtype): the copy engine does it, through ATen's
    _to_copy, by design rather than as a fallback."""
    return make_extern(g, aten._to_copy.default, (x,), kwargs, is_fallback=False)


@lowering(torch.ops.higher_order.with_effects)
def with_effects(g, token, op, *args, **kwargs):
    """An op ordered by an effect token (linalg's error checks, prints): it runs through ATen and
    is never dropped as dead. The token is an empty tensor that only orders effects; the
    scheduler keeps externs in program order, so the input token serves as the output token."""
    if not isinstance(op, torch._ops.OpOverload):
        raise NotImplementedError(f"smelt: with_effects around {op}, which is not an ATen op overload")
    log.debug("smelt: %s runs through its ATen kernel (an effectful op)", op)
    g.fallback_ops.append(str(op))
    _, result_meta = g.out_meta
    result = make_extern(g, op, args, kwargs, is_fallback=True, meta=result_meta, has_side_effects=True)
    return token, result


@lowering(aten.mm, aten.bmm, aten.addmm, aten._addmm_activation, aten.baddbmm, aten.convolution, aten._convolution,
          aten.convolution_backward, aten._scaled_dot_product_flash_attention,
          aten._scaled_dot_product_efficient_attention, torch.ops.smelt.padded_product,
          torch.ops.smelt.short_attention)
def extern_call(g, *args, **kwargs):
    taps = _depthwise_taps(g, args[0]) if g.node.target is aten.convolution.default else 0
    if taps and not kwargs:
        windows = depthwise_windows(g, args[0], args[1], *args[3:6], args[6], args[8], tap_limit=taps)
        if windows is not None:
            return lower_depthwise(g, args[0], args[1], args[2], windows)
    if g.node.target is aten.convolution_backward.default and not kwargs:
        taps = _depthwise_taps(g, args[1], backward=True)
        windows = depthwise_backward_windows(g, *args[:3], *args[4:8], args[9], tap_limit=taps) if taps else None
        if windows is not None:
            return lower_depthwise_backward(g, *args[:3], windows, args[10])
        if onednn_weight_gradient.faults(args[1], args[4], args[10]):
            return onednn_weight_gradient.lower(g, args)
    if g.node.target is aten.convolution.default and not kwargs:
        small = small_products.lower_convolution(g, *args)
        if small is not None:
            return small
    if g.node.target is aten.convolution.default and _wants_products(g) and is_pointwise_convolution(g.node):
        product = lower_pointwise_convolution(g, args[0], args[1])
        if product is not None:
            return product if args[2] is None else _add_bias(g, product, args[2])
    if g.node.target is aten.convolution.default and not kwargs and _wants_packed(g) and is_packable_convolution(g.node):
        x, weight, bias, stride, padding, dilation, _, _, groups = args
        keep = bool(g.config is not None and g.config.freeze_weights)
        out = make_extern(g, torch.ops.smelt.packed_convolution.default,
                          (x, weight, padding, stride, dilation, groups, keep), {}, is_fallback=False)
        return out if bias is None else _add_bias(g, out, bias)
    if g.node.target is aten.convolution.default and args[2] is not None and not kwargs \
            and g.target_for(g.out_meta.device.type).adds_convolution_bias:
        return _convolution_then_bias(g, *args)
    if g.node.target in (aten.mm.default, aten.addmm.default, aten._addmm_activation.default):
        product = _onednn_product(g, args, kwargs)
        if product is not None:
            return product
    if g.node.target is aten.addmm.default and _bias_in_a_kernel(g, kwargs):
        bias, mat1, mat2 = args
        return make_pointwise(g, [make_extern(g, aten.mm.default, (mat1, mat2), {}, is_fallback=False), bias], ops.add)
    return make_extern(g, g.node.target, args, kwargs, is_fallback=False)


# Fewest rows of a float32 product whose bias a kernel adds: below it a product is short and its
# bias kernel's launch may cost more than cuBLASLt's slower kernel (decode's one row a sequence).
# Not measured yet: the H200 rows that showed the SIMT kernel had 4096.
MIN_ROWS_FOR_BIAS_KERNEL = 256


def _bias_in_a_kernel(g, kwargs) -> bool:
    """Whether a float32 addmm runs as mm with its bias added by the kernel after it
    (Target.float32_product_bias_in_kernel): where elementwise ops alone read it, so the add joins
    their kernel. A product read by an ATen call (GPT-2's fused q/k/v projection, split for
    attention) keeps cuBLAS's epilogue, which costs no pass of its own; its mm got the same SIMT
    kernel on the H200 and the add a kernel of its own (12 more launches, 0.2 ms)."""
    meta = g.out_meta
    if kwargs or not isinstance(meta, torch.Tensor) or meta.dtype != torch.float32:
        return False
    setting = g.config.float32_product_bias if g.config is not None else "auto"
    if not switched_on(setting, g.target_for(meta.device.type), "float32_product_bias_in_kernel"):
        return False
    rows = meta.shape[0]
    if isinstance(rows, int) and rows < MIN_ROWS_FOR_BIAS_KERNEL:
        return False
    readers = _readers_past_views(g.node)
    return bool(readers) and all(isinstance(r.target, torch._ops.OpOverload) and torch.Tag.pointwise in r.target.tags
                                 for r in readers)


def _onednn_product(g, args, kwargs):
    """A float32 CPU product over a Linear's weight (mat2 the transpose of a contiguous [N, K], mat1
    contiguous, static sizes), with its bias and the activation of an _addmm_activation, through
    oneDNN's linear, where the setting and the timing of both libraries on its shape choose it
    (runtime/onednn_linear.py); else None."""
    meta = g.out_meta
    setting = g.config.onednn_products if g.config is not None else "auto"
    if not isinstance(meta, torch.Tensor) or meta.dtype != torch.float32 or meta.device.type != "cpu" \
            or not switched_on(setting, g.target_for("cpu"), "onednn_products") or not onednn_linear.available():
        return None
    if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1 or len(args) != len(g.node.args):
        return None
    activation = "none"
    if g.node.target is aten._addmm_activation.default:
        activation = "gelu" if kwargs.get("use_gelu", False) else "relu"  # gelu's erf form on the CPU
    traced = tuple(g.node.args) if g.node.target is not aten.mm.default else (None, *g.node.args)
    bias, mat1, mat2 = (val.meta.get("val") if isinstance(val, torch.fx.Node) else val for val in traced)
    if not (isinstance(mat1, torch.Tensor) and isinstance(mat2, torch.Tensor) and mat1.dim() == mat2.dim() == 2):
        return None
    (rows, inner), columns = mat1.shape, mat2.shape[1]
    if not all(isinstance(n, int) and n > 0 for n in (rows, inner, columns)) or not mat1.is_contiguous() \
            or not mat2.t().is_contiguous():
        return None  # oneDNN makes no primitive for an empty product (eager's is zeros)
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.shape == (columns,) and bias.is_contiguous()):
        return None  # a bias per element, or broadcast from a stride 0
    if setting == "auto" and not onednn_linear.faster_in_onednn(rows, inner, columns, bias is not None,
                                                                g.config.cache_dir if g.config is not None else None):
        return None
    operands = (None, *args) if g.node.target is aten.mm.default else args
    return make_extern(g, torch.ops.smelt.onednn_linear.default, (*operands, activation), {}, is_fallback=False,
                       traced=(*traced, None))


def _readers_past_views(node) -> list:
    """The nodes reading `node`'s elements, past views, reshapes and the items of a split."""
    readers = []
    for user in node.users:
        target = user.target
        if target is operator.getitem or target is aten._unsafe_view.default \
                or isinstance(target, torch._ops.OpOverload) and target.is_view:
            readers += _readers_past_views(user)
        else:
            readers.append(user)
    return readers


def _wants_packed(g) -> bool:
    setting = g.config.packed_convolutions if g.config is not None else "auto"
    return switched_on(setting, g.target_for(g.out_meta.device.type), "packed_convolutions")


def _wants_products(g) -> bool:
    setting = g.config.pointwise_convolutions if g.config is not None else "auto"
    return switched_on(setting, g.target_for(g.out_meta.device.type), "pointwise_convolutions_as_products")


def _depthwise_taps(g, x, backward: bool = False) -> int:
    """The largest depthwise window over input `x` lowered as a smelt kernel here (0: none), in the
    convolution's forward or its backward."""
    setting = g.config.depthwise_kernels if g.config is not None else "auto"
    if setting != "auto":
        return TAP_LIMIT if setting == "on" else 0
    if g.config is not None and g.config.cuda_graphs:
        return 0  # a replay pays GPU time alone, where cuDNN's depthwise kernels are the faster
    if len(x.get_size()) != 4:
        return 0  # measured on 2-D windows (the mobile nets') only
    target = g.target_for(x.get_device().type)
    return target.depthwise_backward_kernel_taps if backward else target.depthwise_kernel_taps


def _convolution_then_bias(g, x, weight, bias, *rest):
    """A convolution run without its bias, which a pointwise add applies: the add fuses into the
    kernel after the convolution, where cuDNN would add it in a pass over the output of its own
    (ConvNeXt's 22 biased convolutions: 0.23 of 2.6 ms on the H100)."""
    return _add_bias(g, make_extern(g, aten.convolution.default, (x, weight, None, *rest), {}, is_fallback=False), bias)


def _add_bias(g, out, bias):
    channels = [1] * (len(out.get_size()) - 2)
    per_channel = TensorBox(View(bias.data, [bias.get_size()[0], *channels], lambda index: index[:1], "bias"))
    # As ATen's add_ of the bias: in float32 for half floats, rounded once.
    return make_pointwise(g, [out, per_channel], ops.add, compute_dtype=upcast_half(g.out_meta.dtype))


@lowering(aten.copy_)
def copy_(g, dst, src, non_blocking=False):
    """Writes into a graph input (an input mutation the functional graph kept): the input is updated."""
    data = dst.data
    if not (isinstance(data, StorageBox) and isinstance(data.data, InputBuffer)):
        return NotImplemented
    target = data.data
    if why_aten(g, g.node) is not None:  # a dtype no kernel computes (float8), a tensor past Halide's extents
        return _copy_in_aten(g, dst, src)
    size = target.get_size()
    dtype = target.get_dtype()
    origins = g.origin

    def write(src):
        # After the graph's outputs: a value read here and by an output realized later (or recomputed
        # by its readers) is computed from the input's old contents everywhere (input_writes.py).
        load = broadcast_loader(src, size)
        loops = Pointwise(target.get_device(), dtype, lambda index: ops.to_dtype(load(index), dtype), size,
                          origins | src.origins)
        written = g.register_computed(loops, layout=target.layout, mutates=target.name)
        source = src.data.data if isinstance(src.data, StorageBox) and src.data.is_realized() else None
        if isinstance(source, ComputedBuffer) and source.mutates is None and source.get_dtype() == dtype \
                and list(source.get_size()) == list(size):
            written.copy_of = source.name  # the scheduler may keep `source` in the input alone

    g.input_writes.append(InputWrite(target, src, write))
    return dst


copy_.runs_aten_itself = True  # where no kernel can do the write, ATen's copy_ does it, still after every read


def _copy_in_aten(g, dst, src):
    """Writes into a graph input no kernel can write (float8, past Halide's extents): ATen's copy_,
    as late as a kernel's write would be."""
    target = dst.data.data
    node = ExternKernel(g.new_name(), None, aten.copy_.default, (), {}, g.origin, is_fallback=True)
    node.has_side_effects = True
    log.debug("smelt: the write into %s runs through ATen's copy_: %s", target.name, why_aten(g, g.node))
    g.fallback_ops.append("aten.copy_")

    def write(src):
        node.args = (target, g.realize(src))
        g.register_buffer(node)

    g.input_writes.append(InputWrite(target, src, write))
    return dst


@lowering(aten.copy)
def copy(g, dst, src, non_blocking=False):
    return make_pointwise(g, [src], lambda v: v, compute_dtype=src.get_dtype())
