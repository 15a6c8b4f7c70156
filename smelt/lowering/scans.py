"""Cumulative ops as Scan nodes: cumsum, cumprod, cummax, cummin, logcumsumexp."""
from __future__ import annotations

from typing import Callable, Sequence

import sympy
import torch

from ..ir import SCAN_COMBINES, Pointwise, Scan, ScanCombine, StorageBox, TensorBox, ops
from ..symbolic import product, static_int
from .registry import lowering

aten = torch.ops.aten

# values(load, index, position) -> tuple: what a scan combines at one element; `position` is the
# element's index along the scanned dimension.
ValuesFn = Callable


def scan_dim(x: TensorBox, dim: int) -> int | None:
    """dim wrapped as eager wraps it; None for a 0-d tensor (which scans its one element)."""
    ndim = len(x.get_size())
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise IndexError(f"smelt: scan dim {dim} out of range for a {ndim}-d tensor")
    if ndim == 0:
        return None
    return dim + ndim if dim < 0 else dim


def make_scan(g, x: TensorBox, dim: int, combine: ScanCombine, values: ValuesFn,
              dtypes: Sequence[torch.dtype]) -> list[TensorBox]:
    """One TensorBox per value the combine carries, each the inclusive scan of x along dim."""
    size = x.get_size()
    load = x.make_loader()
    dim = scan_dim(x, dim)
    device, origins = x.get_device(), g.origin | x.origins
    if dim is None or size[dim] == 1 or static_int(product(size)) == 0:
        # Each scan has at most one element, and the scan of one element is that element.
        def element(index, k):
            return values(load, index, sympy.Integer(0))[k]
        return [TensorBox.of_storage(Pointwise(device, dtype, lambda index, k=k: element(index, k), size, origins))
                for k, dtype in enumerate(dtypes)]

    def inner_fn(index):
        return tuple(values(load, index, index[dim]))
    return [TensorBox(StorageBox(g.register_computed(Scan(device, dtypes, inner_fn, size, dim, combine, k, origins))))
            for k in range(len(dtypes))]


def _cast(value, dtype, like: TensorBox):
    return value if like.get_dtype() == dtype else ops.to_dtype(value, dtype)


@lowering(aten.cumsum, aten.cumprod)
def cumsum_cumprod(g, x, dim, *, dtype=None):
    # Eager's result dtype: `dtype` if given, int64 for integer and bool inputs, else x's.
    out = g.out_meta.dtype
    kind = "sum" if g.node.target.overloadpacket is aten.cumsum else "prod"
    (result,) = make_scan(g, x, dim, SCAN_COMBINES[kind], lambda load, index, _: (_cast(load(index), out, x),), (out,))
    return result


@lowering(aten.logcumsumexp)
def logcumsumexp(g, x, dim):
    if not x.get_dtype().is_floating_point:
        return NotImplemented  # ATen raises eager's error for these
    (result,) = make_scan(g, x, dim, SCAN_COMBINES["logaddexp"], lambda load, index, _: (load(index),),
                          (x.get_dtype(),))
    return result


@lowering(aten.cummax, aten.cummin)
def cummax_cummin(g, x, dim):
    kind = "max" if g.node.target.overloadpacket is aten.cummax else "min"
    dtype = x.get_dtype()
    name = f"{kind}_with_index" if dtype.is_floating_point else f"int_{kind}_with_index"

    def values(load, index, position):
        return load(index), ops.index_expr(position, torch.int64)
    values_box, indices = make_scan(g, x, dim, SCAN_COMBINES[name], values, (dtype, torch.int64))
    return values_box, indices
