"""View ops: reshape, permute, expand, slice, select, squeeze, unsqueeze, as_strided, split."""
from __future__ import annotations

import sympy
import torch

from ..ir import Buffer, ComputedBuffer, FixedLayout, Pointwise, ReinterpretView, StorageBox, TensorBox, View
from ..ir.views import as_strided_layout
from ..symbolic import flat_index, reshape_indexer, sympify, unflatten_index
from .common import out_size
from .registry import lowering

aten = torch.ops.aten


def _view(x: TensorBox, size, reindex, what: str) -> TensorBox:
    return TensorBox(View(x.data, size, reindex, what))


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@lowering(aten.view, aten.reshape, aten._unsafe_view, aten._reshape_alias)
def reshape(g, x, *args):
    if args and isinstance(args[0], torch.dtype):
        return NotImplemented  # view.dtype reinterprets the bits: ATen's view of the same memory
    new, old = out_size(g), x.get_size()
    if [sympy.expand(a - b) for a, b in zip(new, old)] == [0] * len(new) and len(new) == len(old):
        return x
    reindex = reshape_indexer(old, new) or (lambda index: unflatten_index(flat_index(index, new), old))
    return _view(x, new, reindex, "reshape")


@lowering(aten.permute)
def permute(g, x, dims):
    ndim = len(x.get_size())
    dims = [_dim(d, ndim) for d in dims]
    size = [x.get_size()[d] for d in dims]

    def reindex(index):
        old = [None] * ndim
        for new_pos, old_pos in enumerate(dims):
            old[old_pos] = index[new_pos]
        return old
    return _view(x, size, reindex, "permute")


@lowering(aten.t, aten.transpose, aten.numpy_T)
def transpose(g, x, dim0=0, dim1=1):
    ndim = len(x.get_size())
    if ndim < 2:
        return x
    dims = list(range(ndim))
    a, b = _dim(dim0, ndim), _dim(dim1, ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(g, x, dims)


@lowering(aten.expand)
def expand(g, x, size, implicit=False):
    new, old = out_size(g), x.get_size()
    lead = len(new) - len(old)

    def reindex(index):
        return [sympy.Integer(0) if o == 1 and n != 1 else i for i, o, n in zip(index[lead:], old, new[lead:])]
    return _view(x, new, reindex, "expand")


@lowering(aten.unsqueeze)
def unsqueeze(g, x, dim):
    dim = _dim(dim, len(x.get_size()) + 1)
    return _view(x, out_size(g), lambda index: list(index[:dim]) + list(index[dim + 1:]), "unsqueeze")


@lowering(aten.squeeze)
def squeeze(g, x, dim=None):
    old = x.get_size()
    if not old:
        return x  # squeezing a 0-d tensor (any dim) leaves it as it is
    if dim is None:
        dims = [d for d, s in enumerate(old) if s == 1]
    else:
        dims = [_dim(d, len(old)) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        dims = [d for d in dims if old[d] == 1]
    return drop_size_one_dims(x, dims)


def drop_size_one_dims(x: TensorBox, dims) -> TensorBox:
    """x viewed without its dims `dims`, each of size 1."""
    old = x.get_size()
    keep = [d for d in range(len(old)) if d not in dims]

    def reindex(index):
        full = [sympy.Integer(0)] * len(old)
        for i, d in zip(index, keep):
            full[d] = i
        return full
    return _view(x, [old[d] for d in keep], reindex, "squeeze")


def _normalize_start(start, size):
    """The first index a slice reads, with eager's rules for negative and out-of-range starts."""
    start, size = sympify(0 if start is None else start), sympify(size)
    if start.is_Integer and start < 0:
        start = start + size
    if start.is_Integer and size.is_Integer:
        start = sympy.Integer(min(max(int(start), 0), int(size)))
    return start


@lowering(aten.slice)
def slice_(g, x, dim=0, start=None, end=None, step=1):
    size = x.get_size()
    dim = _dim(dim, len(size))
    begin = _normalize_start(start, size[dim])
    new = out_size(g)

    def reindex(index):
        index = list(index)
        index[dim] = begin + index[dim] * step
        return index
    return _view(x, new, reindex, "slice")


@lowering(aten.select)
def select(g, x, dim, index):
    size = x.get_size()
    dim = _dim(dim, len(size))
    index = sympify(index)
    if index.is_Integer and int(index) < 0:
        index = index + size[dim]

    def reindex(idx):
        return list(idx[:dim]) + [index] + list(idx[dim:])
    return _view(x, out_size(g), reindex, "select")


@lowering(aten.as_strided)
def as_strided(g, x, size, stride, storage_offset=None):
    base = _in_traced_strides(g, _storage_buffer(g, x))
    if storage_offset is None:  # as_strided starts where x starts in its storage
        strided = as_strided_layout(x.data if isinstance(x, TensorBox) else x)
        offset = strided[1].offset if strided is not None and strided[0] is base else sympify(0)
    else:  # as_strided's offset counts from the start of the storage; layouts count from the tensor's start.
        offset = sympify(storage_offset) - base.storage_offset
    layout = FixedLayout(base.get_device(), base.get_dtype(), tuple(sympify(s) for s in size),
                         tuple(sympify(s) for s in stride), offset)
    return TensorBox(ReinterpretView(base, layout))


def _in_traced_strides(g, base):
    """`base`, or a copy of it in the strides eager gave the value whose storage as_strided reads.
    as_strided addresses storage with eager's strides, and smelt lays out the buffers its kernels
    compute contiguously: `v = x.clone(); v.t().sub_(1); v.as_strided((3,), (1,), 1)` read the
    difference's rows where eager's storage holds its columns (fuzzer seed 4348, program 159)."""
    traced = _traced_storage(g.node.args[0] if g.node is not None and g.node.args else None)
    if traced is None or not isinstance(base, ComputedBuffer) or base.mutates or base.lives_in:
        return base
    size, stride = traced
    if not _same(base.get_size(), size) or _same(base.layout.stride, stride):
        return base
    layout = FixedLayout(base.get_device(), base.get_dtype(), tuple(size), tuple(stride))
    return g.register_computed(Pointwise(base.get_device(), base.get_dtype(), base.make_loader(), base.get_size(),
                                         base.origins), layout=layout)


def _traced_storage(node):
    """(size, stride), as sympy expressions, eager gave the tensor that owns `node`'s storage (found
    through views), where it owns all of it (offset 0); else None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view and node.args:
        node = node.args[0]
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or node.op != "call_function" or sympify(value.storage_offset()) != 0:
        return None
    return [sympify(s) for s in value.shape], [sympify(s) for s in value.stride()]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(sympy.expand(sympify(x) - sympify(y)) == 0 for x, y in zip(a, b))


def _storage_buffer(g, x):
    """The buffer holding the storage `x` is a view of: as_strided may reach past x's own elements
    into the rest of it (`v[0, 0].as_strided((6, 2), (2, 1))` over a [2, 3, 3] v read 12 of its
    18 elements; realizing the view alone kept 3, and the rest was read out of bounds). The views
    between x and the storage are walked back, the storage realized whole."""
    node = x
    while True:
        if isinstance(node, (TensorBox, View)):
            node = node.data
        elif isinstance(node, StorageBox):
            return node.realize(g)
        elif isinstance(node, ReinterpretView):
            return node.buffer
        elif isinstance(node, Buffer):
            return node
        else:
            buffer = g.realize(x)
            return buffer.buffer if isinstance(buffer, ReinterpretView) else buffer


@lowering(aten.split, aten.split_with_sizes)
def split(g, x, sizes, dim=0):
    metas = g.out_meta
    dim = _dim(dim, len(x.get_size()))
    outs, start = [], sympy.Integer(0)
    for meta in metas:
        length = sympify(meta.shape[dim])
        outs.append(_slice_view(x, dim, start, [sympify(s) for s in meta.shape]))
        start = start + length
    return outs


@lowering(aten.unbind)
def unbind(g, x, dim=0):
    dim = _dim(dim, len(x.get_size()))
    outs = []
    for k, meta in enumerate(g.out_meta):
        outs.append(_view(x, [sympify(s) for s in meta.shape],
                          lambda idx, k=k: list(idx[:dim]) + [sympy.Integer(k)] + list(idx[dim:]), "select"))
    return outs


def _slice_view(x, dim, start, size):
    def reindex(index):
        index = list(index)
        index[dim] = start + index[dim]
        return index
    return _view(x, size, reindex, "slice")
