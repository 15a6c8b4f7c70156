"""Division with rounding: floor_divide, remainder, div(rounding_mode=...).

Integer forms use the backends' floor ops. Float forms follow eager's CPU kernels, built on an
exact fmod, so special values agree: floor_divide(inf, 2) is nan, floor_divide(1, -inf) is -1,
remainder(-0.0, 3) is -0.0, remainder(2, -inf) is -inf, and a division by zero gives a / b."""
from __future__ import annotations

import torch

from ..ir import ops
from .common import in_dtype, make_pointwise, scalar_operand_dtypes
from .half_rounding import rounded_to_half
from .registry import lowering

aten = torch.ops.aten


def float_remainder(a, b, dtype):
    """fmod, moved by one b where its sign differs from b's (eager's remainder)."""
    zero = ops.constant(0.0, dtype)
    mod = ops.fmod(a, b)
    differs = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(b, zero), ops.lt(mod, zero)))
    return ops.where(differs, ops.add(mod, b), mod)


def float_floordiv(a, b, dtype):
    """Eager's floor division: the quotient of a - fmod(a, b), one less where the remainder's
    sign differs from b's, rounded to the nearest integer; a signed zero where it is zero."""
    zero, one, half = (ops.constant(v, dtype) for v in (0.0, 1.0, 0.5))
    mod = ops.fmod(a, b)
    div = ops.truediv(ops.sub(a, mod), b)
    differs = ops.logical_and(ops.ne(mod, zero), ops.ne(ops.lt(b, zero), ops.lt(mod, zero)))
    div = ops.where(differs, ops.sub(div, one), div)
    floored = ops.floor(div)
    floored = ops.where(ops.gt(ops.sub(div, floored), half), ops.add(floored, one), floored)
    quotient = ops.truediv(a, b)
    # A zero quotient takes the sign of a / b (finite here: |a| < |b|).
    result = ops.where(ops.ne(div, zero), floored, ops.mul(quotient, zero))
    return ops.where(ops.eq(b, zero), quotient, result)


def _trunc_div(x, y):
    q = ops.floordiv(x, y)
    r = ops.sub(x, ops.mul(q, y))
    # floor and truncation differ by one when the quotient is negative and inexact.
    fix = ops.logical_and(ops.ne(r, ops.constant(0, torch.int64)),
                          ops.lt(q, ops.constant(0, torch.int64)))
    return ops.where(fix, ops.add(q, ops.constant(1, torch.int64)), q)


def _floor_divide(g, a, b):
    dtype = g.out_meta.dtype
    if dtype.is_floating_point:
        return make_pointwise(g, [a, b], lambda x, y: float_floordiv(x, y, dtype))
    return make_pointwise(g, [a, b], ops.floordiv)


@lowering(aten.floor_divide)
def floor_divide(g, a, b):
    return _floor_divide(g, a, b)


@lowering(aten.remainder)
def remainder(g, a, b):
    dtype = g.out_meta.dtype
    a, b = in_dtype(a, dtype), in_dtype(b, dtype)  # as ATen's kernels read a number operand
    if dtype.is_floating_point:
        return make_pointwise(g, [a, b], lambda x, y: float_remainder(x, y, dtype))
    return make_pointwise(g, [a, b], ops.remainder)


@lowering(aten.div)
def div(g, a, b, rounding_mode=None):
    out = g.out_meta.dtype
    if rounding_mode is None:
        divide = ops.approx_truediv if rounded_to_half(g.node, g.half_rounding_memo) else ops.truediv
        return make_pointwise(g, [a, b], divide, compute_dtype=scalar_operand_dtypes(g, a, b))
    if rounding_mode == "floor":
        return _floor_divide(g, a, b)
    if out.is_floating_point:
        return make_pointwise(g, [a, b], lambda x, y: ops.trunc(ops.truediv(x, y)))
    return make_pointwise(g, [a, b], _trunc_div)
