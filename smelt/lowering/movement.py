"""Data movement by index math: flip, roll, repeat, unfold, diagonal, narrow_copy, as_strided_copy.

Each output element is one input element; only the index map differs. Ops that return views in
eager (unfold, diagonal) become Views; the rest are copies, Pointwise nodes reading through the map.
"""
from __future__ import annotations

import sympy
import torch

from ..ir import Pointwise, TensorBox, View
from ..symbolic import ModularIndexing, flat_index, product, static_int, sympify, unflatten_index
from .common import out_size
from .registry import lowering
from .views import as_strided

aten = torch.ops.aten


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _copy(g, x, reindex, size=None) -> TensorBox:
    load = x.make_loader()
    size = out_size(g) if size is None else size
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), lambda index: load(reindex(index)), size,
                                          g.origin | x.origins))


@lowering(aten.flip)
def flip(g, x, dims):
    size = x.get_size()
    dims = {_dim(d, len(size)) for d in dims}
    return _copy(g, x, lambda index: [size[d] - 1 - i if d in dims else i for d, i in enumerate(index)])


def _rotate(i, shift: int, n: int):
    """The index that lands at i when a dimension of n elements rolls by shift."""
    shift %= n
    return i if shift == 0 else ModularIndexing(i + (n - shift), 1, n)


@lowering(aten.roll)
def roll(g, x, shifts, dims=()):
    size = x.get_size()
    shifts = [static_int(sympify(s)) for s in shifts]
    sizes = [static_int(s) for s in size]
    if None in shifts or None in sizes:
        return NotImplemented  # the modulus must be known: ATen rolls symbolic shapes
    if 0 in sizes:
        return _copy(g, x, lambda index: index)
    if not dims:
        # Rolls the flattened tensor, then restores the shape.
        numel = product(sizes)
        return _copy(g, x, lambda index: unflatten_index(_rotate(flat_index(index, size), shifts[0], numel), size))
    by_dim = {}
    for shift, d in zip(shifts, dims):
        d = _dim(d, len(size))
        by_dim[d] = by_dim.get(d, 0) + shift
    return _copy(g, x, lambda index: [_rotate(i, by_dim[d], sizes[d]) if d in by_dim else i
                                      for d, i in enumerate(index)])


@lowering(aten.repeat)
def repeat(g, x, repeats):
    xsize = x.get_size()
    lead = len(repeats) - len(xsize)

    def reindex(index):
        return [sympy.Integer(0) if s == 1 else ModularIndexing(i, 1, s) for i, s in zip(index[lead:], xsize)]
    return _copy(g, x, reindex)


@lowering(aten.unfold)
def unfold(g, x, dimension, size, step):
    """Windows of `size` elements every `step` along `dimension`, as a new last dimension."""
    xsize = x.get_size()
    if not xsize:
        return TensorBox(View(x.data, out_size(g), lambda index: [], "unfold"))
    dim = _dim(dimension, len(xsize))

    def reindex(index):
        source = list(index[:-1])
        source[dim] = index[dim] * step + index[-1]
        return source
    return TensorBox(View(x.data, out_size(g), reindex, "unfold"))


@lowering(aten.diagonal)
def diagonal(g, x, offset=0, dim1=0, dim2=1):
    ndim = len(x.get_size())
    dim1, dim2 = _dim(dim1, ndim), _dim(dim2, ndim)
    rest = [d for d in range(ndim) if d not in (dim1, dim2)]

    def reindex(index):
        source = [None] * ndim
        for d, i in zip(rest, index[:-1]):
            source[d] = i
        source[dim1] = index[-1] + max(-offset, 0)
        source[dim2] = index[-1] + max(offset, 0)
        return source
    return TensorBox(View(x.data, out_size(g), reindex, "diagonal"))


@lowering(aten.narrow_copy)
def narrow_copy(g, x, dim, start, length):
    size = x.get_size()
    dim = _dim(dim, len(size))
    start = sympify(start)
    if start.is_Integer and start < 0:
        start = start + size[dim]

    def reindex(index):
        index = list(index)
        index[dim] = index[dim] + start
        return index
    return _copy(g, x, reindex)


@lowering(aten.as_strided_copy)
def as_strided_copy(g, x, size, stride, storage_offset=None):
    return _copy(g, as_strided(g, x, size, stride, storage_offset), lambda index: index)
