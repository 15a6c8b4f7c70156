"""The random ops printed in Triton: Philox values keyed by (seed, element offset).

A uniform value at offset i is word i % 4 of the Philox block at counter i // 4, as floats in
[0, 1) (tl.rand4x). One Philox call then serves four neighbouring elements: when a 1-D kernel's
lanes draw consecutive offsets, it runs once per four lanes, which keeps dropout memory-bound.
Anywhere else the same value is found by picking word i % 4, so every kernel agrees on it.
randn is tl.randn. randint64 joins two 32-bit Philox words into 64 random bits
and reduces them into [low, high): the modulo bias is at most (high - low) / 2**64.
"""
from __future__ import annotations

import torch

from ...scheduler.nodes import XINDEX
from ..common import CSEVar

INTERPRETER_MODULE = "interpreter_random"
INTERPRETER_IMPORT = f"from smelt.runtime import {INTERPRETER_MODULE}"


def _module(kernel) -> str:
    """Where the kernel finds Philox: Triton's own functions, or their interpreter copies."""
    kernel.uses_random = True
    return INTERPRETER_MODULE if kernel.interpret else "tl"


def _offset(kernel, offset: CSEVar) -> str:
    if offset.rank == 0:
        # A 0-d random tensor's one offset is a literal; Philox wants a tensor of offsets.
        return kernel.emit(f"tl.full([], {offset}, tl.int32)", torch.int32, 0).name
    return offset.name


def normal(kernel, seed: CSEVar, offset: CSEVar) -> CSEVar:
    """A float32 drawn from N(0, 1)."""
    return kernel.emit(f"{_module(kernel)}.randn({seed}, {_offset(kernel, offset)})", torch.float32, offset.rank)


def uniform(kernel, seed: CSEVar, offset: CSEVar, offset_expr) -> CSEVar:
    """A float32 drawn from U[0, 1); offset_expr is the offset as an index expression when known."""
    module = _module(kernel)
    start = _lane_run_start(kernel, offset_expr)
    if start is not None:
        counters = kernel.emit(f"({start}) // 4 + tl.arange(0, XBLOCK // 4)", torch.int64, 1)
        words = kernel.emit(f"{module}.rand4x({seed}, {counters})", torch.float32, 1)
        # join(join(w0, w2), join(w1, w3)) is [n, a, b] = w[2a + b]: flat, lane 4n + k gets word k.
        pairs = f"tl.join({words}[0], {words}[2]), tl.join({words}[1], {words}[3])"
        return kernel.emit(f"tl.reshape(tl.join({pairs}), [XBLOCK])", torch.float32, 1)
    offset_text = _offset(kernel, offset)
    words = kernel.emit(f"{module}.rand4x({seed}, {offset_text} // 4)", torch.float32, offset.rank)
    word = kernel.emit(f"{offset_text} % 4", offset.dtype, offset.rank)
    return kernel.emit(f"tl.where({word} == 0, {words}[0], tl.where({word} == 1, {words}[1], "
                       f"tl.where({word} == 2, {words}[2], {words}[3])))", torch.float32, offset.rank)


def _lane_run_start(kernel, offset_expr) -> str | None:
    """The first offset, when a 1-D kernel's lanes draw offsets start, start + 1, ... with start a
    multiple of 4 (so four lanes share one Philox block); None otherwise."""
    if offset_expr is None or kernel.plan.is_reduction or kernel.config.XBLOCK % 4 or kernel.mask_stack:
        return None
    shift = offset_expr - XINDEX
    if XINDEX in shift.free_symbols or not shift.is_Integer or int(shift) % 4:
        return None
    return f"xoffset + {int(shift)}" if shift else "xoffset"


def randint64(kernel, seed: CSEVar, offset: CSEVar, low: CSEVar, high: CSEVar) -> CSEVar:
    rank = offset.rank
    words = kernel.emit(f"{_module(kernel)}.randint4x({seed}, {_offset(kernel, offset)})", torch.int32, rank)
    bits = kernel.emit(f"({words}[0].to(tl.uint64) << 32) | {words}[1].to(tl.uint64)", torch.int64, rank)
    try:
        span = str(int(high.name) - int(low.name))
    except ValueError:
        span = f"({high} - {low}).to(tl.uint64)"
    drawn = f"({bits} % {span}).to(tl.int64)"
    return kernel.emit(drawn if low.name == "0" else f"{low} + {drawn}", torch.int64, rank)
