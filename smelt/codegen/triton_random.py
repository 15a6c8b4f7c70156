"""The random ops printed in Triton: Philox values keyed by (seed, element offset).

rand / randn are tl.rand / tl.randn. randint64 joins two 32-bit Philox words into 64 random bits
and reduces them into [low, high): the modulo bias is at most (high - low) / 2**64.
"""
from __future__ import annotations

import torch

from .common import CSEVar

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


def uniform_or_normal(kernel, kind: str, seed: CSEVar, offset: CSEVar) -> CSEVar:
    """kind is "rand" (U[0, 1)) or "randn" (N(0, 1)); the value is a float32."""
    text = f"{_module(kernel)}.{kind}({seed}, {_offset(kernel, offset)})"
    return kernel.emit(text, torch.float32, offset.rank)


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
