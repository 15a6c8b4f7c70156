"""Triton for online_softmax_reduce: a row's max m and its sum of exp(v - m), together.

With the whole row in registers this is the plain two-step formula, exact and as eager computes
it. Looped over r, the kernel keeps the row's running max and, per lane, a running sum. Each block
of r first finds its own max (a reduction across the block); the row max moves to it if larger,
every lane's sum is rescaled by exp(old max - new max), once per block, and the block's elements
each add exp(v - new max). That is one exp per element, as in the persistent form: keeping a max
per lane instead costs a rescale, a compare and two selects per element, which left an H100 short
of issue slots at full bandwidth (88% vs 93% of copy bandwidth on bf16 rows of 32768,
benchmarks/probes/reduction_variants.py).
"""
from __future__ import annotations

from ..common import CSEVar, register_dtype
from .ops import EXP, literal, triton_type

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
    terms = kernel.emit(EXP.format(shifted), dtype, 2)
    row_sum = kernel.emit(f"tl.reduce({_masked(kernel, terms, 0)}, 1, {_SUM})[:, None]", dtype, 1)
    return row_max, row_sum


def reduce_looped(kernel, value: CSEVar) -> tuple[CSEVar, CSEVar]:
    dtype = register_dtype(value.dtype)
    ttype = triton_type(dtype)
    acc = f"acc{kernel.cse.counter}"
    kernel.cse.counter += 1
    row_max, lane_sum = f"{acc}_online_max", f"{acc}_online_sum"
    kernel.loop_prologue.writeline(f"{row_max} = tl.full([XBLOCK, 1], float(\"-inf\"), {ttype})")
    kernel.loop_prologue.writeline(f"{lane_sum} = tl.full([XBLOCK, RBLOCK], {literal(0, dtype)}, {ttype})")
    masked = _masked(kernel, value, float("-inf"))
    lanes = kernel.emit(masked, value.dtype, 2) if masked != value.name else value
    block_max = kernel._extreme_of("max", lanes, dtype)
    new_max = kernel.emit(f"tl.maximum({row_max}, {block_max}, propagate_nan=tl.PropagateNan.ALL)", dtype, 1)
    # Until the row has seen a finite value its max is -inf, and v - max would be -inf - -inf = NaN:
    # measured from 0 instead, every exp is exp(-inf) = 0 and the sum stays 0.
    base = kernel.emit(f'tl.where({new_max} == float("-inf"), {literal(0, dtype)}, {new_max})', dtype, 1)
    rescale, term = EXP.format(f"{row_max} - {base}"), EXP.format(f"{lanes} - {base}")
    kernel.body.writeline(f"{lane_sum} = {lane_sum} * {rescale} + {term}")
    kernel.body.writeline(f"{row_max} = {new_max}")

    loop_body, kernel.body = kernel.body, kernel.loop_epilogue
    try:
        total = kernel.emit(f"tl.reduce({lane_sum}, 1, {_SUM})[:, None]", dtype, 1)
        # Eager's sum(exp(v - amax)) over a row of -inf is NaN (-inf - -inf in every term).
        row_sum = kernel.emit(f'tl.where({row_max} == float("-inf"), float("nan"), {total})', dtype, 1)
    finally:
        kernel.body = loop_body
    kernel.loop_epilogue.writeline(f"{acc}_row_max = {row_max}")
    kernel.loop_epilogue.writeline(f"{acc}_row_sum = {row_sum}")
    return CSEVar(f"{acc}_row_max", dtype, 1), CSEVar(f"{acc}_row_sum", dtype, 1)
