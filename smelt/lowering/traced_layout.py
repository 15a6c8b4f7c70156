"""Values realized in the layout they had when the graph was traced, where smelt can produce it.

Two kinds of readers see a value's strides: the caller, for a graph output (eager returns
`(x + 1).t()` as a transposed view, not a contiguous copy), and ATen, for an extern call's input (a
convolution of a channels-last input returns channels-last memory, and the kernels after it are
planned for the traced result's strides). Both get a view of the realized base where eager had a
view, and dense values in eager's dim order.
"""
from __future__ import annotations

import dataclasses

import sympy
import torch
import torch.fx

from ..ir import FixedLayout, FlexibleLayout, Pointwise, StorageBox, TensorBox
from ..ir.views import ReinterpretView, View
from ..symbolic import dense_dim_order, sympify
from .common import is_dense


def realize_as_traced(graph, box: TensorBox, node):
    """A strided form of `box`, the value of FX node `node`, whose size and strides are those of
    the node's traced value wherever smelt can produce them: the base of a view is realized (with its eager strides when
    dense) so the view aliases it; a dense result laid out otherwise is copied into eager's strides."""
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor):
        return graph.realize(box)
    # Gapped strides too (slice_scatter into a strided input keeps its strides): a graph output
    # saved for the backward is read there with its traced strides, which a dense copy breaks.
    dense = _dense_strides(meta) or _gapped_strides(meta)
    data = box.data
    if isinstance(data, StorageBox) and not data.is_realized():
        return _realize_dense(graph, data, dense)
    base = _eager_base(node)
    if base is not None:
        _realize_base(graph, box.data, base)
    strided = graph.realize(box)
    if _matches(strided, meta):
        if isinstance(strided, ReinterpretView):
            # Dims of one element take eager's stride too (unsqueeze's is not 0).
            stride = tuple(sympify(s) for s in meta.stride())
            strided = ReinterpretView(strided.buffer, dataclasses.replace(strided.layout, stride=stride))
        return strided
    if dense is None:
        return strided
    loops = Pointwise(box.get_device(), box.get_dtype(), box.make_loader(), box.get_size(), box.origins)
    layout = FixedLayout(box.get_device(), box.get_dtype(), tuple(box.get_size()), tuple(dense))
    return graph.register_computed(loops, layout=layout)


def realize_in_traced_order(graph, data: StorageBox, node: torch.fx.Node):
    """Realize the loop nest `data`, the whole value of FX node `node`, in the dim order eager gave
    that value when it is dense (a channels-last activation stays channels-last), else row-major."""
    meta = node.meta.get("val")
    return _realize_dense(graph, data, _dense_strides(meta) if isinstance(meta, torch.Tensor) else None)


def realize_view_base(graph, box: TensorBox, node: torch.fx.Node) -> None:
    """Realize the lazy base under the view `box` (the value of FX node `node`), in the strides
    eager gave that base when they are dense."""
    base = _eager_base(node)
    data = box.data
    while isinstance(data, View):
        data = data.data
    if base is not None:
        _realize_base(graph, box.data, base)
    elif isinstance(data, StorageBox) and not data.is_realized():
        data.realize(graph)


def _realize_dense(graph, data: StorageBox, dense: list | None):
    buffer = data.realize(graph)
    if dense is not None and isinstance(buffer.layout, FlexibleLayout) and dense != list(buffer.layout.stride):
        buffer.fix_strides(dense)
    return buffer


def view_base_node(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose tensor output `node` is a view of, walking ATen view ops; `node` itself when
    it is no view."""
    while isinstance(node, torch.fx.Node) and isinstance(node.target, torch._ops.OpOverload) \
            and node.target.is_view and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _eager_base(node: torch.fx.Node) -> torch.Tensor | None:
    """The value (eager's strides) of the tensor output `node` is a view of (the traced values do
    not keep their bases)."""
    base = view_base_node(node)
    value = base.meta.get("val") if base is not node else None
    return value if isinstance(value, torch.Tensor) else None


def _realize_base(graph, node, base_meta: torch.Tensor) -> None:
    while isinstance(node, (View, TensorBox)):
        node = node.data
    if not isinstance(node, StorageBox) or node.is_realized():
        return
    buffer = node.realize(graph)
    stride = _dense_strides(base_meta)
    if isinstance(buffer.layout, FlexibleLayout) and stride is not None \
            and list(buffer.layout.size) == [sympify(s) for s in base_meta.size()] \
            and stride != list(buffer.layout.stride):
        buffer.fix_strides(stride)


def _dense_strides(meta: torch.Tensor) -> list | None:
    """Eager's strides as expressions if they pack the elements with no gaps or overlaps (symbolic
    ones compared as expressions, so no guard is added), else None."""
    if is_dense(meta):
        return [sympify(s) for s in meta.stride()]
    size = [sympify(s) for s in meta.size()]
    stride = [sympify(s) for s in meta.stride()]
    if all(isinstance(e, sympy.Integer) for e in (*size, *stride)):
        return None
    remaining = [d for d in range(len(size)) if size[d] != 1]
    expected = sympy.Integer(1)
    while remaining:
        d = next((d for d in remaining if sympy.expand(stride[d] - expected) == 0), None)
        if d is None:
            return stride if _dense_at_its_hints(meta) else None
        remaining.remove(d)
        expected = expected * size[d]
    return stride


def _gapped_strides(meta: torch.Tensor) -> list | None:
    """Eager's strides where no two elements share an address (gaps allowed), else None. Symbolic
    ones are judged at the sizes traced, as _dense_at_its_hints does: CUDA's efficient attention
    pads its bias's rows to a multiple of 8 (a stride of s - Mod(s, 8) + 8) and refuses a dense one."""
    sizes, strides = [_hint(v) for v in meta.size()], [_hint(v) for v in meta.stride()]
    if any(v is None for v in (*sizes, *strides)) or 0 in sizes:
        return None
    dims = sorted((strides[d], sizes[d]) for d in range(meta.dim()) if sizes[d] != 1)
    extent = 1  # offsets 0 .. extent - 1 are what the smaller-stride dims reach
    for stride, size in dims:
        if stride < extent:
            return None
        extent += stride * (size - 1)
    return [sympify(s) for s in meta.stride()]


def _hint(v):
    return v.node.hint if isinstance(v, torch.SymInt) else v


def _dense_at_its_hints(meta: torch.Tensor) -> bool:
    """Whether symbolic strides are a dense order at the sizes traced, where the expressions do not
    show it (a head dim of s//(s//8) beside s//8 heads: their product is s only where 8 divides s,
    which the view itself required)."""
    sizes, strides = [_hint(v) for v in meta.size()], [_hint(v) for v in meta.stride()]
    if any(v is None for v in (*sizes, *strides)):
        return False
    return dense_dim_order(sizes, strides) is not None


def _matches(strided, meta: torch.Tensor) -> bool:
    """Same size and strides (an offset a copy could not give anyway is not compared)."""
    layout = strided.layout
    if [sympify(s) for s in meta.size()] != list(layout.size):
        return False
    # Dims of one element may have any stride.
    return all(n == 1 or a == sympify(b) for n, a, b in zip(layout.size, layout.stride, meta.stride()))
