"""Convolutions run through another library call than ATen's convolution: a 1x1 one over a
channels-last activation as the matrix product it is, a float32 one on the CPU through oneDNN with
its weight packed (runtime/packed_convolution.py).

With stride 1, no padding and one group, out[n, :, h, w] = weight[:, :, 0, 0] @ x[n, :, h, w]: over
NHWC memory the activation is a [N*H*W, C_in] matrix with rows one apart, the result a [N*H*W, C_out]
one in the output's channels-last memory. The product runs in cuBLAS (the same float32 accumulation
of the same products as cuDNN's kernels, in its own order); what it saves is host time: cuDNN's
convolution call costs 22-33 us on the H100 host (cProfile, EfficientNet-B0) where a product costs
8.7 (`model_host_time --micro`, RESULTS 2026-11-27), and at batch 32
a mobile net's inference waits on the host (Target.pointwise_convolutions_as_products).
"""
from __future__ import annotations

import sympy
import torch

from ..ir import ExternKernel, FixedLayout, FlexibleLayout, TensorBox
from ..ir.views import ReinterpretView
from ..runtime import packed_convolution
from .common import traced_value
from .traced_layout import realize_as_traced

aten = torch.ops.aten


def is_pointwise_convolution(node: torch.fx.Node) -> bool:
    """A 2-D convolution the product can replace: 1x1 window, stride 1, no padding, no dilation,
    not transposed, one group; on CUDA half floats only (a float32 convolution may run in TF32
    under cuDNN's own switch, a product under another)."""
    values = _convolution_values(node)
    if values is None:
        return False
    x, weight, out = values
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    return (tuple(weight.shape[2:]) == (1, 1) and list(stride) == [1, 1] and list(padding) == [0, 0]
            and list(dilation) == [1, 1] and not transposed and groups == 1
            and (x.dtype in (torch.bfloat16, torch.float16) or (x.dtype == torch.float32 and x.device.type == "cpu"))
            and _nhwc_dense(x) and _nhwc_dense(out))


def _nhwc_dense(t: torch.Tensor) -> bool:
    n, c, h, w = t.shape
    expected = (h * w * c, 1, w * c, c)
    return all(size == 1 or s == e for size, s, e in zip(t.shape, t.stride(), expected))


def lower_pointwise_convolution(g, x, weight):
    """The convolution's value without its bias, as a view of an `aten.mm` of the activation's and
    the weight's matrices; None where the realized operands are not laid out as the trace had them."""
    node = g.node
    x_strided = realize_as_traced(g, x, node.args[0])
    w_strided = realize_as_traced(g, weight, node.args[1])
    n, c_in, h, w = x_strided.get_size()
    c_out = w_strided.get_size()[0]
    nhwc = (h * w * c_in, 1, w * c_in, c_in)
    rows = _matrix(x_strided, (n * h * w, c_in), (c_in, 1),
                   lambda st: all(size == 1 or s == e for size, s, e in zip((n, c_in, h, w), st, nhwc)))
    # The weight's [C_out, C_in, 1, 1] read as [C_in, C_out]: its element (i, o) at o * C_in + i.
    columns = _matrix(w_strided, (c_in, c_out), (1, c_in), lambda st: (c_out == 1 or st[0] == c_in) and (c_in == 1 or st[1] == 1))
    if rows is None or columns is None:
        return None
    meta = node.meta["val"]
    layout = FixedLayout(meta.device, meta.dtype, (n * h * w, c_out), (c_out, sympy.Integer(1)))
    product = ExternKernel(g.new_name(), layout, aten.mm.default, (rows, columns), {}, g.origin, False)
    product.storage_offset = sympy.Integer(0)
    g.register_buffer(product)
    out = FixedLayout(meta.device, meta.dtype, (n, c_out, h, w), (h * w * c_out, sympy.Integer(1), w * c_out, c_out))
    return TensorBox(ReinterpretView(product, out))


def _matrix(strided, size, stride, laid_out) -> ReinterpretView | None:
    """`strided` (a buffer or a view of one) read as a matrix of `size` and `stride`, where its
    own strides pass `laid_out`."""
    layout = strided.layout
    if not laid_out([sympy.sympify(s) for s in layout.stride]):
        return None
    base = strided.buffer if isinstance(strided, ReinterpretView) else strided
    if isinstance(base.layout, FlexibleLayout):  # the view reads these strides: nobody may change them now
        base.fix_strides(base.layout.stride)
    offset = layout.offset if isinstance(strided, ReinterpretView) else sympy.Integer(0)
    return ReinterpretView(base, FixedLayout(layout.device, layout.dtype, tuple(size), tuple(stride), offset))


def is_packable_convolution(node: torch.fx.Node) -> bool:
    """A float32 2-D convolution on the CPU that smelt::packed_convolution runs: not transposed, and
    this torch has oneDNN's ops."""
    values = _convolution_values(node)
    if values is None or node.args[6]:
        return False
    x, weight, _ = values
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and packed_convolution.available())


def _convolution_values(node: torch.fx.Node):
    """(input, weight, output) as traced, for a 2-D aten.convolution with all its arguments; else None."""
    if node.target is not aten.convolution.default or len(node.args) != 9 or node.kwargs:
        return None
    values = (traced_value(node.args[0]), traced_value(node.args[1]), traced_value(node))
    if not all(isinstance(t, torch.Tensor) for t in values) or values[0].dim() != 4:
        return None
    return values
