"""Writes through index tensors: scatter, scatter_reduce, index_put, index_reduce, and the
`*_scatter` ops that embed one tensor into a copy of another.

Every op that writes at loaded positions builds the same two steps: a fresh buffer holding a copy
of `self` (an ordinary Pointwise, fused with whatever computes `self`), then a Scatter that updates
that buffer in place (its values computed in the scatter kernel). Reductions that Triton has an
atomic for (sum, amax, amin; mean as a sum and a count; prod as a compare-and-swap loop) are
lowered; element types without atomics run through ATen.
"""
from __future__ import annotations

import logging

import sympy
import torch

from ..ir import ComputedBuffer, Pointwise, Scatter, TensorBox, ops
from ..ir.scatter import mode_supports
from ..symbolic import FloorDiv, ModularIndexing, dense_dim_order, product, static_int, sympify
from .common import broadcast_loader, refusing_negative, scalar_value
from ..ir.graph import origin_name
from .registry import lowering
from .views import _normalize_start

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

REDUCE_MODES = {"sum": "atomic_add", "add": "atomic_add", "mean": "atomic_add", "amax": "atomic_max",
                "amin": "atomic_min", "prod": "atomic_mul"}


# ---------------------------------------------------------------- the two steps


def copy_to_new_buffer(g, x: TensorBox, dtype: torch.dtype | None = None, origins=frozenset()) -> ComputedBuffer:
    dtype = dtype or x.get_dtype()
    load = x.make_loader()
    loops = Pointwise(x.get_device(), dtype, lambda index: ops.to_dtype(load(index), dtype), x.get_size(),
                      g.origin | x.origins | origins)
    return g.register_computed(loops)


def scatter_into(g, target: ComputedBuffer, ranges, value_fn, output_index, mode, origins=frozenset()):
    """Register `target[output_index(i)] (mode)= value_fn(i)` for i in ranges; returns the result."""
    dtype = target.get_dtype()
    loops = Scatter(target.get_device(), dtype, lambda index: ops.to_dtype(value_fn(index), dtype), ranges,
                    output_index, mode, g.origin | origins)
    return g.register_computed(loops, layout=target.layout, mutates=target.name)


def _unsupported(g, why: str):
    log.debug("smelt: %s runs in ATen: %s", origin_name(g.node), why)
    return NotImplemented


def _reduce_into(g, x: TensorBox, ranges, value_fn, output_index, reduce: str, include_self: bool, origins):
    """x with every value_fn(i) combined into x[output_index(i)] by `reduce`; include_self=False
    leaves x's own value out of every element that receives at least one value."""
    dtype = x.get_dtype()
    mode = REDUCE_MODES.get(reduce)
    if mode is None:
        return _unsupported(g, f"no Triton atomic for reduce={reduce!r}")
    work = _combining_dtype(mode, dtype, reduce)
    if work is None:
        return _unsupported(g, f"no Triton {mode} for {dtype}")
    if any(s == 0 for s in ranges):
        return TensorBox.of_storage(copy_to_new_buffer(g, x))
    target = copy_to_new_buffer(g, x, work)
    if reduce == "mean":  # made before the scatters, so that both scatters may share one kernel
        counts = g.register_computed(Pointwise(x.get_device(), torch.int32,
                                               lambda index: ops.constant(int(include_self), torch.int32),
                                               x.get_size(), g.origin))
    if not include_self:
        start = _reduction_identity(reduce, work)
        scatter_into(g, target, ranges, lambda index: ops.constant(start, work), output_index, None)
    result = scatter_into(g, target, ranges, value_fn, output_index, mode, origins)
    load_result = result.make_loader()
    if reduce != "mean":
        if work == dtype:
            return TensorBox.of_storage(result)
        return TensorBox.of_storage(Pointwise(x.get_device(), dtype, lambda index: ops.to_dtype(
            load_result(index), dtype), x.get_size(), g.origin))

    # mean: the sum divided by how many values each element received (self counting as one).
    counted = scatter_into(g, counts, ranges, lambda index: ops.constant(1, torch.int32), output_index,
                           "atomic_add")
    load_count = counted.make_loader()

    def mean(index):
        # An element nobody wrote keeps self (count 0 only when include_self=False).
        count = ops.to_dtype(ops.maximum(load_count(index), ops.constant(1, torch.int32)), work)
        divide = ops.truediv if work.is_floating_point else ops.floordiv
        return ops.to_dtype(divide(load_result(index), count), dtype)
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, mean, x.get_size(), g.origin))


def _combining_dtype(mode: str, dtype: torch.dtype, reduce: str) -> torch.dtype | None:
    """The type to combine in: dtype, or one with an atomic whose result cast back is eager's.

    Half floats combine in float32 (rounded once instead of at every step). Narrow integers and
    bool combine in int32: sums and products wrap to the same bits once truncated, max and min
    are exact, and a bool sum/max/prod is nonzero exactly when eager's or/and is true. Not for
    an integer mean, which divides the unwrapped sum."""
    if mode_supports(mode, dtype):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        wide = torch.float32
    elif dtype in (torch.int8, torch.int16, torch.uint8, torch.bool) and reduce != "mean":
        wide = torch.int32
    else:
        return None
    return wide if mode_supports(mode, wide) else None


def _reduction_identity(reduce: str, dtype: torch.dtype):
    if reduce in ("sum", "mean", "add"):
        return 0
    if reduce == "prod":
        return 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    return info.min if reduce == "amax" else info.max


def _dim(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


def _loader_at(x, rank: int):
    """A loader taking an index of `rank` dims: a 0-d tensor reads its one element."""
    load = x.make_loader()
    if len(x.get_size()) == rank:
        return load
    assert not x.get_size(), (x.get_size(), rank)
    return lambda index: load([])


# ---------------------------------------------------------------- scatter family


def _along_dim(index: TensorBox, dim: int, dim_size, rank: int):
    """Positions of scatter: the index with dimension `dim` replaced by the value loaded there."""
    load = _loader_at(index, len(index.get_size()))

    def output_index(idx):
        position = refusing_negative(load(list(idx)[:len(index.get_size())]), dim_size, index.get_dtype())
        if rank == 0:
            return []
        out = list(idx)
        out[dim] = position
        return out
    return output_index


def _scatter_common(g, x, dim, index, src, reduce, include_self=True):
    xsize = x.get_size()
    dim = _dim(dim, len(xsize))
    ranges = index.get_size()
    dtype = x.get_dtype()
    if isinstance(src, TensorBox):
        load_src = _loader_at(src, len(ranges))
        origins = src.origins

        def value_fn(idx):
            return load_src(idx)
    else:
        origins = frozenset()

        def value_fn(idx):
            return scalar_value(src, dtype)
    output_index = _along_dim(index, dim, xsize[dim] if xsize else 1, len(xsize))
    # With one value per element at most, a sum is x plus it there (gather's backward: scatter_add
    # into zeros), and leaving x out (include_self=False) is the plain scatter.
    if (reduce is None or (reduce == "sum" and dtype != torch.bool)) and _one_position_per_line(xsize, ranges, dim):
        return _select_at_positions(g, x, dim, index, value_fn, origins, adds=reduce == "sum" and include_self)
    if reduce is None:
        if any(s == 0 for s in ranges):
            return TensorBox.of_storage(copy_to_new_buffer(g, x))
        target = copy_to_new_buffer(g, x)
        return TensorBox.of_storage(scatter_into(g, target, ranges, value_fn, output_index, None, origins))
    return _reduce_into(g, x, ranges, value_fn, output_index, reduce, include_self, origins)


def _one_position_per_line(xsize, ranges, dim: int) -> bool:
    """Whether the index names one position along `dim` for every line of x along it (the index
    spans x but for a size of 1 along `dim`): a one-hot scatter, such as cross-entropy's backward."""
    if len(xsize) == 0 or len(ranges) != len(xsize) or static_int(ranges[dim]) != 1:
        return False
    if not (static_int(xsize[dim]) or 0) > 0:
        return False  # no element to select: every index is out of bounds, and the scatter kernel says so
    return all(sympy.simplify(a - b) == 0 for d, (a, b) in enumerate(zip(xsize, ranges)) if d != dim)


def _select_at_positions(g, x: TensorBox, dim: int, index: TensorBox, value_fn, origins,
                         adds: bool = False) -> TensorBox:
    """scatter with one position per line, as a pointwise op: each element is the scattered value
    (added to x's where `adds`) where the line's index names it, else x's. Nothing is stored first
    (a one-hot gradient of [4096, 50257] floats was written whole, then scattered into, then read
    back)."""
    dtype = x.get_dtype()
    load_x, load_index = x.make_loader(), index.make_loader()
    size = x.get_size()[dim]
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype  # rounded once, as eager's add

    def select(idx):
        line = list(idx)
        line[dim] = sympy.Integer(0)
        position = refusing_negative(load_index(line), size, index.get_dtype())  # checked, as the scatter's
        here = ops.eq(ops.index_expr(position, torch.int64), ops.index_expr(idx[dim], torch.int64))
        value = ops.to_dtype(value_fn(line), dtype)
        if adds:
            value = ops.to_dtype(ops.add(ops.to_dtype(load_x(idx), work), ops.to_dtype(value, work)), dtype)
        return ops.where(here, value, load_x(idx))
    # A loop nest, not a buffer: where kernels on both sides of a reduction read it (cross-entropy's
    # gradient, summed and then used), each recomputes it from the index rather than storing it.
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, select, x.get_size(),
                                          g.origin | x.origins | index.origins | origins))


@lowering(aten.scatter)
def scatter(g, x, dim, index, src, reduce=None):
    """scatter.src / .value, and the deprecated reduce='add' | 'multiply' forms."""
    return _scatter_common(g, x, dim, index, src, {"add": "sum", "multiply": "prod"}.get(reduce, reduce))


@lowering(aten.scatter_add)
def scatter_add(g, x, dim, index, src):
    return _scatter_common(g, x, dim, index, src, "sum")


@lowering(aten.scatter_reduce.two)
def scatter_reduce(g, x, dim, index, src, reduce, include_self=True):
    return _scatter_common(g, x, dim, index, src, reduce, include_self)


@lowering(aten.index_reduce)
def index_reduce(g, x, dim, index, source, reduce, include_self=True):
    """Along `dim`, slice k of source is combined into slice index[k] of x."""
    xsize = x.get_size()
    dim = _dim(dim, len(xsize))
    # A 0-d x and source count as one-element vectors, as in eager.
    ranges = source.get_size() or [sympy.Integer(1)]
    load_index = _loader_at(index, 1)
    load_src = _loader_at(source, len(ranges))

    def output_index(idx):
        position = refusing_negative(load_index([idx[dim]]), xsize[dim] if xsize else 1, index.get_dtype())
        if not xsize:
            return []
        out = list(idx)
        out[dim] = position
        return out
    return _reduce_into(g, x, ranges, load_src, output_index, reduce, include_self, source.origins)


# ---------------------------------------------------------------- index_put


def _broadcast_sizes(sizes):
    rank = max(len(s) for s in sizes)
    out = []
    for d in range(rank):
        along = [s[len(s) - rank + d] for s in sizes if len(s) - rank + d >= 0]
        picked = [s for s in along if s != 1]
        out.append(picked[0] if picked else sympy.Integer(1))
    return out


@lowering(aten.index_put, aten._unsafe_index_put)
def index_put(g, x, indices, values, accumulate=False):
    """x[indices] = values (or += with accumulate), with numpy's advanced-indexing rules."""
    if any(i is not None and i.get_dtype() in (torch.bool, torch.uint8) for i in indices):
        return _index_put_masked(g, x, indices, values, accumulate)
    xsize = x.get_size()
    indices = list(indices) + [None] * (len(xsize) - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        return _unsupported(g, "no index tensor")
    tensors = [indices[d] for d in dims]
    bshape = _broadcast_sizes([t.get_size() for t in tensors])
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    # Where the broadcast index dims sit among the written ones: in place of the indexed dims when
    # those are adjacent, else first (the shape x[indices] has).
    first = dims[0] if adjacent else 0
    kept = [d for d in range(len(xsize)) if d not in dims]
    if adjacent:
        ranges = list(xsize[:first]) + bshape + list(xsize[dims[-1] + 1:])
    else:
        ranges = bshape + [xsize[d] for d in kept]
    loaders = [broadcast_loader(t, bshape) for t in tensors]

    def output_index(idx):
        bindex = idx[first:first + len(bshape)]
        rest = list(idx[:first]) + list(idx[first + len(bshape):])
        out = [None] * len(xsize)
        for d, load in zip(dims, loaders):
            out[d] = ops.indirect_indexing(load(bindex), xsize[d])
        for d, i in zip(kept, rest):
            out[d] = i
        return out

    load_values = broadcast_loader(values, ranges)
    if accumulate:
        return _reduce_into(g, x, ranges, load_values, output_index, "sum", True, values.origins)
    if any(s == 0 for s in ranges):
        return TensorBox.of_storage(copy_to_new_buffer(g, x))
    target = copy_to_new_buffer(g, x)
    return TensorBox.of_storage(scatter_into(g, target, ranges, load_values, output_index, None, values.origins))


def _index_put_masked(g, x, indices, values, accumulate):
    """x[mask] = values where every selected slice gets the same values (a scalar, or one row
    broadcast over the selection): a pointwise where. Values per selected slice sit at positions
    that depend on how many elements the mask holds before them: ATen does those."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    if len(dims) != 1:
        return _unsupported(g, "a boolean mask index together with other indices")
    xsize = x.get_size()
    (d,) = dims
    mask = indices[d]
    k = len(mask.get_size())
    # The written shape is xsize[:d] + [count] + xsize[d + k:]; values align to it from the right.
    per_selection = [sympy.Integer(1)] + list(xsize[d + k:])
    vsize = values.get_size()
    if len(vsize) > len(per_selection) - 1 and vsize[len(vsize) - len(per_selection)] != 1:
        return _unsupported(g, "boolean mask index with a different value per selected element")
    written = list(xsize[:d]) + per_selection
    load_x, load_mask, load_values = x.make_loader(), mask.make_loader(), broadcast_loader(values, written)
    dtype = x.get_dtype()

    def inner_fn(index):
        old = load_x(index)
        new = ops.to_dtype(load_values(list(index[:d]) + [sympy.Integer(0)] + list(index[d + k:])), dtype)
        if accumulate:
            new = ops.add(old, new)
        return ops.where(ops.to_dtype(load_mask(index[d:d + k]), torch.bool), new, old)
    origins = g.origin | x.origins | mask.origins | values.origins
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, inner_fn, xsize, origins))


# ---------------------------------------------------------------- embedding one tensor in another


def _embed(g, x, src, inside, src_index):
    """A pointwise copy of x whose elements where `inside(index)` holds come from src."""
    load_x, load_src = x.make_loader(), src.make_loader()
    dtype = x.get_dtype()

    def inner_fn(index):
        cond = inside(index)
        value = ops.masked(cond, lambda: ops.to_dtype(load_src(src_index(index)), dtype), 0)
        return ops.where(cond, value, load_x(index))
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, inner_fn, x.get_size(),
                                          g.origin | x.origins | src.origins))


def _index_value(expr):
    return ops.index_expr(sympify(expr), torch.int64)


@lowering(aten.slice_scatter)
def slice_scatter(g, x, src, dim=0, start=None, end=None, step=1):
    xsize = x.get_size()
    dim = _dim(dim, len(xsize))
    begin = _normalize_start(start, xsize[dim])
    count = src.get_size()[dim]  # eager's meta already clipped the slice to this many elements

    def inside(index):
        offset = index[dim] - begin
        cond = ops.logical_and(ops.ge(_index_value(offset), ops.constant(0, torch.int64)),
                               ops.lt(_index_value(offset), _index_value(step * count)))
        if step != 1:
            remainder = ops.remainder(_index_value(offset), ops.constant(step, torch.int64))
            cond = ops.logical_and(cond, ops.eq(remainder, ops.constant(0, torch.int64)))
        return cond

    def src_index(index):
        out = list(index)
        out[dim] = FloorDiv(index[dim] - begin, sympify(step))
        return out
    return _embed(g, x, src, inside, src_index)


@lowering(aten.diagonal_scatter)
def diagonal_scatter(g, x, src, offset=0, dim1=0, dim2=1):
    ndim = len(x.get_size())
    dim1, dim2 = _dim(dim1, ndim), _dim(dim2, ndim)

    def inside(index):
        return ops.eq(_index_value(index[dim2] - index[dim1]), ops.constant(offset, torch.int64))

    def src_index(index):
        rest = [i for d, i in enumerate(index) if d not in (dim1, dim2)]
        return rest + [index[dim1] if offset >= 0 else index[dim2]]
    return _embed(g, x, src, inside, src_index)


@lowering(aten.as_strided_scatter)
def as_strided_scatter(g, x, src, size, stride, storage_offset=None):
    """src written where as_strided(copy of x, size, stride, storage_offset) would read.

    The copy has eager's strides (its meta's); a storage position is turned back into an element
    index of that layout, so the copy itself may be laid out however smelt likes."""
    meta = g.out_meta
    numbers = [static_int(sympify(s)) for s in [*meta.shape, *meta.stride(), *size, *stride, storage_offset or 0]]
    if None in numbers:
        return _unsupported(g, "as_strided_scatter with symbolic sizes")
    out_size, out_strides = [int(s) for s in meta.shape], [int(s) for s in meta.stride()]
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    base = int(storage_offset or 0)
    order = dense_dim_order(out_size, out_strides)
    if order is None:
        return _unsupported(g, f"output strides {out_strides} of size {out_size} are not dense")
    load_src = src.make_loader()

    def output_index(idx):
        position = base + sum((i * s for i, s in zip(idx, stride)), sympy.Integer(0))
        out = [sympy.Integer(0)] * len(out_size)
        for d in order:
            stride_d, size_d = sympy.Integer(out_strides[d]), sympy.Integer(out_size[d])
            out[d] = FloorDiv(position, stride_d) if d == order[0] else ModularIndexing(position, stride_d, size_d)
        return out
    if product(size) == 0:
        return TensorBox.of_storage(copy_to_new_buffer(g, x))
    target = copy_to_new_buffer(g, x)
    return TensorBox.of_storage(scatter_into(g, target, size, load_src, output_index, None, src.origins))
