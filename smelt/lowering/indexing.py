"""Reads through index tensors: advanced indexing, index_select, gather, embedding's index."""
from __future__ import annotations

import torch

from ..ir import Pointwise, TensorBox, ops
from ..symbolic import product, unflatten_index
from .common import broadcast_loader, out_size, refusing_negative
from .registry import lowering

aten = torch.ops.aten


@lowering(aten.index, aten._unsafe_index)
def index(g, x, indices):
    """x[i0, i1, ...] with some index tensors (None keeps a dimension), numpy's rules."""
    if any(i is not None and i.get_dtype() in (torch.bool, torch.uint8) for i in indices):
        return NotImplemented  # a boolean mask gives a data-dependent shape: ATen does it
    xsize = x.get_size()
    size = out_size(g)
    dims = [d for d, i in enumerate(indices) if i is not None]
    tensors = [indices[d] for d in dims]
    bshape_rank = max(len(t.get_size()) for t in tensors)
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    # Where the broadcast index dims sit in the output: in place of the indexed dims when those
    # are adjacent, else first.
    first = dims[0] if adjacent else 0
    bshape = size[first:first + bshape_rank]
    loaders = [broadcast_loader(t, bshape) for t in tensors]
    load = x.make_loader()
    kept = [d for d in range(len(xsize)) if d not in dims]

    def inner_fn(out_index):
        bindex = out_index[first:first + bshape_rank]
        rest = list(out_index[:first]) + list(out_index[first + bshape_rank:])
        source = [None] * len(xsize)
        for d, l in zip(dims, loaders):
            source[d] = ops.indirect_indexing(l(bindex), xsize[d])
        for d, i in zip(kept, rest):
            source[d] = i
        return load(source)
    origins = g.origin | x.origins
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), inner_fn, size, origins))


@lowering(aten.embedding)
def embedding(g, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """weight[indices] (the options change only the backward; a negative id is out of bounds). Kept
    as one op through AOTAutograd (decompositions.py) so that the min-cut partitioner sees a lookup
    it will not recompute, as Inductor's does."""
    rows = weight.get_size()[0]
    load_weight, load_id = weight.make_loader(), indices.make_loader()

    def inner_fn(out_index):
        position = load_id(list(out_index[:-1]))
        return load_weight([refusing_negative(position, rows, indices.get_dtype()), out_index[-1]])
    return TensorBox.of_storage(Pointwise(weight.get_device(), weight.get_dtype(), inner_fn, out_size(g),
                                          g.origin | weight.origins))


@lowering(aten.index_select)
def index_select(g, x, dim, index):
    xsize = x.get_size()
    dim = dim + len(xsize) if dim < 0 else dim
    if not xsize:
        return NotImplemented
    load, index_load = x.make_loader(), index.make_loader()
    size = out_size(g)

    def inner_fn(out_index):
        source = list(out_index)
        position = [out_index[dim]] if index.get_size() else []
        source[dim] = refusing_negative(index_load(position), xsize[dim], index.get_dtype())
        return load(source)
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), inner_fn, size, g.origin | x.origins))


@lowering(aten.gather)
def gather(g, x, dim, index, sparse_grad=False):
    xsize = x.get_size()
    if not xsize:
        return NotImplemented
    dim = dim + len(xsize) if dim < 0 else dim
    load, index_load = x.make_loader(), index.make_loader()
    size = out_size(g)
    if len(index.get_size()) != len(xsize):
        # Eager allows an index of another rank only when it is empty: nothing to load.
        return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(),
                                              lambda i: ops.constant(0, x.get_dtype()), size, g.origin))

    def inner_fn(out_index):
        source = list(out_index)
        source[dim] = refusing_negative(index_load(out_index), xsize[dim], index.get_dtype())
        return load(source)
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), inner_fn, size, g.origin | x.origins))


@lowering(aten.take)
def take(g, x, index):
    xsize = x.get_size()
    numel = product(xsize)
    load, index_load = x.make_loader(), index.make_loader()

    def inner_fn(out_index):
        flat = ops.indirect_indexing(index_load(out_index), numel)
        return load(unflatten_index(flat, xsize))
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), inner_fn, out_size(g),
                                          g.origin | x.origins))
