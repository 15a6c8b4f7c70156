"""Views: tensors that read another tensor's elements through an index map.

A View composes index maps over any IRNode, realized or not. A ReinterpretView is the strided
form of a view over a realized buffer: it can be handed to ATen or returned as an alias, because
its elements are exactly `torch.as_strided(buffer, size, stride, offset)`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import sympy

from ..symbolic import Expr, index_var, simplify_index, sympify
from .nodes import Buffer, FixedLayout, IRNode, Layout, StorageBox, TensorBox
from .ops import ops


class View(IRNode):
    def __init__(self, data: IRNode, size: Sequence[Expr], reindex: Callable, what: str):
        self.data = data
        self.size = [sympify(s) for s in size]
        self.reindex = reindex
        self.what = what

    @property
    def origins(self):
        return self.data.origins

    def get_size(self):
        return list(self.size)

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self):
        inner, reindex = self.data.make_loader(), self.reindex
        return lambda index: inner(reindex(index))

    def __str__(self):
        return f"{self.what}[{', '.join(map(str, self.size))}]({self.data})"


class ReinterpretView(IRNode):
    def __init__(self, buffer: Buffer, layout: Layout):
        self.buffer = buffer
        self.layout = layout

    @property
    def origins(self):
        return frozenset()  # a strided view loads from memory and inlines nothing

    @property
    def name(self):
        return self.buffer.storage_name

    storage_name = name

    def get_size(self):
        return list(self.layout.size)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def make_loader(self):
        name, layout = self.name, self.layout
        return lambda index: ops.load(name, layout.index(index))

    def __str__(self):
        return f"ReinterpretView({self.name}, {self.layout})"


def unwrap_view_chain(node: IRNode):
    """(innermost realized Buffer or None, index map from the outer index to the buffer's index)."""
    maps = []
    while True:
        if isinstance(node, TensorBox):
            node = node.data
        elif isinstance(node, View):
            maps.append(node.reindex)
            node = node.data
        elif isinstance(node, StorageBox):
            if not node.is_realized():
                return None, None
            node = node.data
        elif isinstance(node, ReinterpretView):
            layout = node.layout
            maps.append(lambda idx, layout=layout: [layout.index(idx)])
            return node.buffer, _compose(maps, flat_storage=True)
        elif isinstance(node, Buffer):
            return node, _compose(maps, flat_storage=False)
        else:
            return None, None


def _compose(maps, flat_storage):
    def reindex(index):
        for m in maps:
            index = m(index)
        return index
    reindex.flat_storage = flat_storage
    return reindex


def as_strided_layout(node: IRNode) -> tuple[Buffer, Layout] | None:
    """If `node` reads a realized buffer through a linear index map, the equivalent strided layout."""
    buffer, reindex = unwrap_view_chain(node)
    if buffer is None:
        return None
    size = node.get_size()
    vars_ = [index_var(f"v{k}") for k in range(len(size))]
    mapped = reindex(vars_)
    storage_index = mapped[0] if reindex.flat_storage else buffer.layout.index(mapped)
    # expanded: coeff() reads only top-level terms, and simplify may leave s*(v0 + v1)
    storage_index = sympy.expand(simplify_index(storage_index, dict(zip(vars_, size))))
    if any(isinstance(a, sympy.Function) and not a.free_symbols.isdisjoint(vars_)
           for a in sympy.preorder_traversal(storage_index)):
        return None  # div/mod of the view's indices left over: not expressible with strides
    # (a function of sizes alone is a stride like any other: a row padded to 8 is s - Mod(s, 8) + 8)
    if vars_:
        poly = sympy.Poly(storage_index, *vars_)
        if poly.total_degree() > 1 or not all(c.free_symbols.isdisjoint(vars_) for c in poly.coeffs()):
            return None
    stride = [storage_index.coeff(v) if v in storage_index.free_symbols else sympy.Integer(0) for v in vars_]
    offset = storage_index.subs({v: 0 for v in vars_})
    layout = FixedLayout(buffer.layout.device, buffer.layout.dtype, tuple(size), tuple(stride), offset)
    return buffer, layout
