"""Elementwise ops with float-specific rules: round to decimals, NaN-ignoring fmax/fmin, ldexp,
angle of real numbers, nextafter."""
from __future__ import annotations

import math

import torch

from ..ir import ops
from .common import make_pointwise
from .registry import lowering

aten = torch.ops.aten


@lowering(aten.round)
def round_(g, x, *, decimals=0):
    dtype = g.out_meta.dtype
    if decimals == 0 or not dtype.is_floating_point:
        return make_pointwise(g, [x], ops.round)
    # As eager: scale by a power of ten in the compute type, round half to even, scale back.
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    scale = float(10 ** abs(decimals))

    def fn(v):
        k = ops.constant(scale, compute)
        if decimals > 0:
            return ops.truediv(ops.round(ops.mul(v, k)), k)
        return ops.mul(ops.round(ops.truediv(v, k)), k)
    return make_pointwise(g, [x], fn, compute_dtype=compute)


def _nan_ignoring(combine):
    """fmax / fmin: a NaN loses to a number; only two NaNs give NaN."""
    def lower(g, a, b):
        if not g.out_meta.dtype.is_floating_point:
            return make_pointwise(g, [a, b], combine)
        return make_pointwise(g, [a, b], lambda x, y: ops.where(ops.isnan(x), y, ops.where(ops.isnan(y), x,
                                                                                              combine(x, y))))
    return lower


lowering(aten.fmax)(_nan_ignoring(ops.maximum))
lowering(aten.fmin)(_nan_ignoring(ops.minimum))


@lowering(aten.ldexp)
def ldexp(g, x, exponent):
    return make_pointwise(g, [x, exponent], lambda v, e: ops.mul(v, ops.exp2(e)))


@lowering(aten.angle)
def angle(g, x):
    """The argument of a real number: pi for negatives, 0 otherwise, NaN stays NaN."""
    out = g.out_meta.dtype

    def fn(v):
        value = ops.where(ops.lt(v, ops.constant(0, out)), ops.constant(math.pi, out), ops.constant(0.0, out))
        return ops.where(ops.isnan(v), v, value) if x.get_dtype().is_floating_point else value
    return make_pointwise(g, [x], fn)


@lowering(aten.nextafter)
def nextafter(g, x, other):
    if g.out_meta.dtype not in (torch.float32, torch.float64):
        return NotImplemented  # half floats are computed in float32, where a step is far smaller
    return make_pointwise(g, [x, other], ops.nextafter)
