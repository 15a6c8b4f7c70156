"""Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, any/all, var_mean (Welford)."""
from __future__ import annotations

import sympy
import torch

from .. import config
from ..ir import Reduction, StorageBox, TensorBox, ops
from ..ir.reduction_kinds import kind
from ..symbolic import product, sympify
from .common import make_pointwise
from .registry import lowering
from .split_reduction import choose_split, reads_columns
from .two_stage_reduction import make_split_reduction

aten = torch.ops.aten


def _dims(x, dims) -> list[int]:
    ndim = len(x.get_size())
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + ndim if d < 0 else d for d in dims}) if ndim else []


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a sum or Welford pass accumulates in: float32 for half floats, int64 for integers."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.int64
    return dtype


def make_reduction(g, x: TensorBox, dims, keepdim: bool, reduction_type: str, out_dtype: torch.dtype,
                   src_dtype: torch.dtype, outputs: tuple[int, ...] = (0,), origins: frozenset = frozenset()):
    """A realized reduction of x over `dims`, its buffer shaped as eager's result (keepdim or not).

    A reduction that yields several values (Welford) gets one buffer per index in `outputs`; they
    share one inner_fn, so a kernel computes them together, once. Returns a TensorBox, or a
    list of them when several outputs are asked for. Few outputs over many elements are reduced
    in two kernels (split_reduction.py).
    """
    size = x.get_size()
    dims = _dims(x, dims)
    kept = [d for d in range(len(size)) if d not in dims]
    ranges = [sympy.Integer(1) if d in dims else size[d] for d in range(len(size))] if keepdim \
        else [size[d] for d in kept]
    reduction_ranges = [size[d] for d in dims]
    load = x.make_loader()
    split = None
    if kind(reduction_type).splits:
        split = choose_split(product(size[d] for d in kept), product(reduction_ranges),
                             lambda: reads_columns(load, size, dims), config.current(),
                             g.target_for(x.get_device().type))
    if split is not None:
        results = make_split_reduction(g, x, dims, keepdim, ranges, reduction_type, out_dtype, src_dtype, outputs,
                                       split)
        return results[0] if len(outputs) == 1 else results

    def inner_fn(index, rindex):
        full = [None] * len(size)
        out_dims = range(len(size)) if keepdim else kept
        for d, i in zip(out_dims, index):
            if d in kept:
                full[d] = i
        for d, r in zip(dims, rindex):
            full[d] = r
        value = load(full)
        return value if x.get_dtype() == src_dtype else ops.to_dtype(value, src_dtype)

    results = [TensorBox(StorageBox(g.register_computed(
        Reduction(x.get_device(), out_dtype, inner_fn, ranges, reduction_ranges, reduction_type, src_dtype, k,
                  origins=g.origin | x.origins | origins)))) for k in outputs]
    return results[0] if len(outputs) == 1 else results


def _accumulating(kind: str):
    """sum / prod: accumulate in float32 for half floats (int64 for integers), then cast."""
    def lower(g, x, dims=None, keepdim=False, dtype=None):
        if kind == "sum":
            computed = g.softmax_rows.sum_result(g)  # already reduced with its amax, in one pass
            if computed is not None:
                return computed
        out = g.out_meta.dtype
        acc = accumulator_dtype(out)
        if dtype is not None and dtype != x.get_dtype():
            # As eager: the input converted to `dtype` first (float32 past a half float's range
            # is inf there), then accumulated.
            x = make_pointwise(g, [x], lambda v: v, compute_dtype=dtype, out_dtype=dtype, size=x.get_size())
        result = make_reduction(g, x, dims, keepdim, kind, acc, acc)
        return result if acc == out else make_pointwise(g, [result], lambda v: v, compute_dtype=acc)
    return lower


lowering(aten.sum)(_accumulating("sum"))
lowering(aten.prod)(_accumulating("prod"))


@lowering(aten.mean)
def mean(g, x, dims=None, keepdim=False, dtype=None):
    out = g.out_meta.dtype
    acc = accumulator_dtype(out)
    count = product(x.get_size()[d] for d in _dims(x, dims))
    total = make_reduction(g, x, dims, keepdim, "sum", acc, acc)
    return make_pointwise(g, [total, count], ops.truediv, compute_dtype=acc)


def _extreme(kind):
    def lower(g, x, dims=None, keepdim=False):
        dtype = x.get_dtype()
        return make_reduction(g, x, dims, keepdim, kind, dtype, dtype)
    return lower


@lowering(aten.amax)
def amax(g, x, dims=None, keepdim=False):
    # amax(v) followed by sum(exp(v - amax)): both come from one online-softmax reduction.
    statistics = g.softmax_rows.lower_statistics(g, x, dims)
    return statistics if statistics is not None else _extreme("max")(g, x, dims, keepdim)


lowering(aten.amin)(_extreme("min"))


@lowering(aten.max, aten.min)
def max_min(g, x, dim=None, keepdim=False):
    kind = "max" if g.node.target.overloadpacket is aten.max else "min"
    if isinstance(dim, (torch.Tensor, TensorBox)):
        return NotImplemented  # the binary form is aten.maximum's job; ATen runs it
    dtype = x.get_dtype()
    if dim is None:
        return make_reduction(g, x, None, False, kind, dtype, dtype)
    values = make_reduction(g, x, dim, keepdim, kind, dtype, dtype)
    indices = make_reduction(g, x, dim, keepdim, "arg" + kind, torch.int64, dtype)
    return values, indices


@lowering(aten.argmax, aten.argmin)
def argmax_argmin(g, x, dim=None, keepdim=False):
    kind = "argmax" if g.node.target.overloadpacket is aten.argmax else "argmin"
    if dim is None:
        # Over every dim: a reduction's position runs over its reduced elements in row-major
        # order, which is the index into x.reshape(-1) that eager returns.
        return make_reduction(g, x, None, keepdim, kind, torch.int64, x.get_dtype())
    return make_reduction(g, x, dim, keepdim, kind, torch.int64, x.get_dtype())


@lowering(aten.any, aten.all)
def any_all(g, x, dim=None, keepdim=False):
    kind = "any" if g.node.target.overloadpacket is aten.any else "all"
    as_bool = x if x.get_dtype() == torch.bool else make_pointwise(
        g, [x], lambda v: v, compute_dtype=x.get_dtype(), out_dtype=torch.bool, size=x.get_size())
    result = make_reduction(g, as_bool, dim, keepdim, kind, torch.bool, torch.bool)
    out = g.out_meta.dtype
    # uint8 gives uint8 0/1 in eager (a legacy rule), every other dtype bool.
    return result if out == torch.bool else make_pointwise(g, [result], lambda v: v, compute_dtype=torch.bool)


@lowering(aten.var_mean)
def var_mean(g, x, dims=None, *, correction=None, keepdim=False, unbiased=None):
    var, mean_ = _var_and_mean(g, x, dims, correction, keepdim, unbiased)
    return var, mean_


@lowering(aten.var)
def var(g, x, dims=None, *, correction=None, keepdim=False, unbiased=None):
    return _var_and_mean(g, x, dims, correction, keepdim, unbiased)[0]


def _var_and_mean(g, x, dims, correction, keepdim, unbiased):
    metas = g.out_meta if isinstance(g.out_meta, (tuple, list)) else (g.out_meta,)
    out = metas[0].dtype
    acc = accumulator_dtype(out)
    if correction is None:
        correction = 0 if unbiased is False else 1
    count = product(x.get_size()[d] for d in _dims(x, dims))
    mean_acc, m2 = make_reduction(g, x, dims, keepdim, "welford_reduce", acc, acc, outputs=(0, 1))
    denominator = sympify(count - correction)
    if denominator.is_number:  # eager divides by max(0, N - correction); std passes a float correction
        denominator = max(float(denominator), 0.0) if isinstance(correction, float) else max(int(denominator), 0)
    var_ = make_pointwise(g, [m2, denominator], ops.truediv, compute_dtype=acc, out_dtype=out,
                          size=m2.get_size())
    mean_ = mean_acc if acc == out else make_pointwise(g, [mean_acc], lambda v: v, compute_dtype=acc,
                                                       out_dtype=out, size=mean_acc.get_size())
    return var_, mean_
