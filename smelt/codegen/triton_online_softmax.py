"""Triton for online_softmax_reduce: a row's max m and its sum of exp(v - m), together.

With the whole row in registers this is the plain two-step formula, exact and as eager computes
it. Looped over r, each lane keeps a running max and a sum rescaled whenever that max grows
(`_online_softmax_update`); after the loop the lanes are merged: the row max M, then the sum of
each lane's sum times exp(lane max - M). That merge is two plain reductions rather than one
tl.reduce with a custom combine: the interpreter runs a custom combine element by element in
Python, and on the GPU it happens once per row either way.
"""
from __future__ import annotations

from .common import CSEVar
from .triton_ops import literal, register_dtype, triton_type

_SUM = "tl.standard._sum_combine"


def _masked(kernel, value: CSEVar, fill) -> str:
    mask = kernel.mask_for(2)
    return f"tl.where({mask}, {value}, {literal(fill, register_dtype(value.dtype))})" if mask else value.name


def reduce_persistent(kernel, value: CSEVar) -> tuple[CSEVar, CSEVar]:
    dtype = register_dtype(value.dtype)
    lanes = _masked(kernel, value, float("-inf"))
    lanes = kernel.emit(lanes, value.dtype, 2) if lanes != value.name else value
    row_max = kernel._extreme_of("max", lanes, dtype)
    # Printed as the ops printer prints them, so the output's own exp(v - m) reuses these.
    shifted = kernel.emit(f"{value} - {row_max}", dtype, 2)
    terms = kernel.emit(f"tl.exp({shifted})", dtype, 2)
    row_sum = kernel.emit(f"tl.reduce({_masked(kernel, terms, 0)}, 1, {_SUM})[:, None]", dtype, 1)
    return row_max, row_sum


def reduce_looped(kernel, value: CSEVar) -> tuple[CSEVar, CSEVar]:
    dtype = register_dtype(value.dtype)
    ttype = triton_type(dtype)
    acc = f"acc{kernel.cse.counter}"
    kernel.cse.counter += 1
    lane_max, lane_sum = f"{acc}_max", f"{acc}_sum"
    kernel.loop_prologue.writeline(f"{lane_max} = tl.full([XBLOCK, RBLOCK], float(\"-inf\"), {ttype})")
    kernel.loop_prologue.writeline(f"{lane_sum} = tl.full([XBLOCK, RBLOCK], {literal(0, dtype)}, {ttype})")
    kernel.helpers.add("_online_softmax_update")
    masked = _masked(kernel, value, float("-inf"))
    kernel.body.writeline(f"{lane_max}, {lane_sum} = _online_softmax_update({lane_max}, {lane_sum}, {masked})")

    loop_body, kernel.body = kernel.body, kernel.loop_epilogue
    try:
        row_max = kernel._extreme_of("max", CSEVar(lane_max, dtype, 2), dtype)
        # A lane that saw only -inf holds (-inf, 0): it adds nothing, and must not add
        # 0 * exp(-inf - -inf) = NaN.
        rescaled = kernel.emit(f'tl.where({lane_max} == float("-inf"), {literal(0, dtype)}, '
                               f'{lane_sum} * tl.exp({lane_max} - {row_max}))', dtype, 2)
        total = kernel.emit(f"tl.reduce({rescaled}, 1, {_SUM})[:, None]", dtype, 1)
        # Eager's sum(exp(v - amax)) over a row of -inf is NaN (-inf - -inf in every term).
        row_sum = kernel.emit(f'tl.where({row_max} == float("-inf"), float("nan"), {total})', dtype, 1)
    finally:
        kernel.body = loop_body
    kernel.loop_epilogue.writeline(f"{acc}_row_max = {row_max}")
    kernel.loop_epilogue.writeline(f"{acc}_row_sum = {row_sum}")
    return CSEVar(f"{acc}_row_max", dtype, 1), CSEVar(f"{acc}_row_sum", dtype, 1)
