"""Scatter: a loop nest that writes into an existing buffer at computed (often loaded) positions.

A scatter lowering first copies `self` into a fresh buffer (an ordinary Pointwise), then registers
a Scatter as a ComputedBuffer that `mutates` that buffer: for every index of `ranges`,

    out[output_index(index)] = inner_fn(index)          (mode None: plain store)
    out[output_index(index)] op= inner_fn(index)        (an atomic mode: add, max, min, mul)

`output_index(index)` is a loop body too: it may load index tensors and call
`ops.indirect_indexing`, and returns an index into the output's shape. Several indices may land on
one element; with an atomic mode every contribution counts, with a plain store one of them wins (as
in eager, which does not promise which).
"""
from __future__ import annotations

from typing import Callable

import torch

from .loops import Loops
from .ops import TextHandler, use_handler

# Store modes and the Triton atomic each one prints as. Triton has no atomic multiply: it is a
# compare-and-swap loop.
SCATTER_MODES = {None: "tl.store", "atomic_add": "tl.atomic_add", "atomic_max": "tl.atomic_max",
                 "atomic_min": "tl.atomic_min", "atomic_mul": None}

# Element types each atomic takes (Triton 3.6+, compiled and interpreted alike). bfloat16 add
# depends on the GPU, and 8/16-bit integers have none: those scatters run in ATen.
ATOMIC_DTYPES = {
    "atomic_add": {torch.float16, torch.float32, torch.float64, torch.int32, torch.int64},
    "atomic_max": {torch.float32, torch.float64, torch.int32, torch.int64},
    "atomic_min": {torch.float32, torch.float64, torch.int32, torch.int64},
    "atomic_mul": {torch.float32, torch.float64, torch.int32, torch.int64},
}


def mode_supports(mode: str | None, dtype: torch.dtype) -> bool:
    return mode is None or dtype in ATOMIC_DTYPES[mode]


class Scatter(Loops):
    """out[output_index(index)] (mode)= inner_fn(index) for every index in `ranges`."""

    def __init__(self, device, dtype, inner_fn: Callable, ranges, output_index: Callable,
                 mode: str | None = None, origins=frozenset()):
        super().__init__(device, dtype, inner_fn, ranges, origins)
        if mode not in SCATTER_MODES:
            raise ValueError(f"smelt: unknown scatter mode {mode!r}")
        if not mode_supports(mode, dtype):
            raise ValueError(f"smelt: no Triton {mode} for {dtype}")
        self.output_index = output_index
        self.mode = mode

    def make_loader(self):
        raise AssertionError("a Scatter is realized into the buffer it updates before anything loads from it")

    def __str__(self):
        with use_handler(TextHandler()):
            index = self.index_vars()
            target = ", ".join(map(str, self.output_index(index)))
            value = self.inner_fn(index)
        op = "=" if self.mode is None else f"{self.mode.replace('atomic_', '')}="
        return f"Scatter[{', '.join(map(str, self.ranges))}](out[{target}] {op} {value})"
