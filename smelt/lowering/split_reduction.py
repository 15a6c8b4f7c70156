"""When a reduction is split into two kernels, and into how many pieces.

A reduction kernel runs one program per block of outputs and loops over the reduced elements,
so a reduction with few outputs (a global sum, a column sum of a tall matrix) runs on a handful
of an H100's 132 SMs. Splitting it gives the first kernel `splits` programs per output block, each
reducing one chunk of `chunk` consecutive reduced elements; a second, small kernel reduces the
partial results (lowering/two_stage_reduction.py builds both).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy

from ..config import Config
from ..ir.ops import ReadsHandler, use_handler
from ..symbolic import index_var, next_power_of_2, static_int

# Programs the first kernel should have: about 8 per SM of an H100 (132 SMs). A program of a long
# row runs 2 warps, one of a column block 8 (choose_blocks), so this keeps loads in flight on every
# SM, while the partials stay few enough (at most this many per output block) that the second
# kernel costs next to nothing. Not yet tuned on the GPU: benchmarks/split_reductions.py times
# several values.
TARGET_PROGRAMS = 1024
# Programs of a split row reduction: many short chunks, each read by one program in one go. On an
# H100 a global sum of 2**26 float32 ran at 93% of copy bandwidth with 16384 chunks of 4096 whose
# last program adds the partials (codegen/triton/finisher.py), against 86-88% with 1024 longer
# chunks looped over (benchmarks/probes/reduction_variants.py).
ROW_TARGET_PROGRAMS = 16384
# A reduction to one value splits from this many elements, below the configured minimum: its
# second stage runs in the first kernel's last program (a finisher), so the split costs no launch,
# and a gather in its body (cross entropy's target logits) runs on many SMs instead of one.
GLOBAL_MIN_NUMEL = 4096
# Split only when that at least doubles the number of programs: with more than half the target
# already running, the gain is smaller than the cost of a second launch.
SPLIT_BELOW_PROGRAMS = TARGET_PROGRAMS // 2
# Reduced elements each first-kernel program handles, at least: the partials it writes are then
# at most 1/256 of what it reads.
MIN_CHUNK = 256
# Outputs one program of an unsplit reduction covers. A row reduction (reading along r) runs one
# output per program; a column reduction reads tiles of this many neighbouring outputs, so that
# its loads are coalesced (codegen/triton/kernel.py `choose_blocks` caps its XBLOCK at the same value).
COLUMN_OUTPUTS_PER_PROGRAM = 64


@dataclasses.dataclass(frozen=True)
class Split:
    splits: int  # chunks each output's reduced elements are cut into
    chunk: int  # reduced elements per chunk (a power of two); the last chunk may be shorter
    columns: bool  # partials laid out [splits, outputs] (column reductions) rather than [outputs, splits]

    def tail(self, reduction_numel: int) -> int:
        """How many elements the last chunk holds."""
        return reduction_numel - (self.splits - 1) * self.chunk


def choose_split(outputs, reduction_numel, reads_columns: Callable[[], bool], config: Config) -> Split | None:
    """A split for a reduction of `outputs` results over `reduction_numel` elements each, or None
    to keep it one kernel. Only static sizes are split: the choice depends on their values.
    `reads_columns` tells whether it is a column reduction (asked only when the sizes qualify)."""
    outputs, numel = static_int(outputs), static_int(reduction_numel)
    if not config.split_reductions or outputs is None or numel is None or outputs == 0:
        return None
    if numel < 2 * MIN_CHUNK:
        return None
    columns = reads_columns()
    per_program = min(outputs, COLUMN_OUTPUTS_PER_PROGRAM if columns else 1)
    programs = -(-outputs // per_program)
    min_numel = config.split_reduction_min_numel if outputs > 1 else min(config.split_reduction_min_numel,
                                                                         GLOBAL_MIN_NUMEL)
    if programs > SPLIT_BELOW_PROGRAMS or per_program * numel < min_numel:
        return None
    wanted = (TARGET_PROGRAMS if columns else ROW_TARGET_PROGRAMS) // programs
    chunk = max(MIN_CHUNK, next_power_of_2(-(-numel // wanted)))
    splits = -(-numel // chunk)
    if splits < 2:
        return None
    return Split(splits, chunk, columns)


def reads_columns(load, size, reduced: list[int]) -> bool:
    """Whether reading x's reduced elements walks memory across rows: the nearest elements in memory
    are neighbouring outputs, not neighbouring reduced elements (x.sum(0) of a row-major matrix).

    Looks at the strides of what x's loader reads, so a transposed input counts by its memory
    order; when no read tells (no loads, broadcasts), falls back to the logical order.
    """
    kept = [d for d in range(len(size)) if d not in reduced]
    if not kept or not reduced:
        return False
    index = [index_var(f"split{d}") for d in range(len(size))]
    handler = ReadsHandler()
    with use_handler(handler):
        load(index)
    for _, expr in handler.reads:
        expr = sympy.expand(sympy.sympify(expr))
        reduced_stride = _smallest_stride(expr, [index[d] for d in reduced])
        kept_stride = _smallest_stride(expr, [index[d] for d in kept])
        if reduced_stride is not None and kept_stride is not None:
            return kept_stride < reduced_stride
    return kept[-1] > reduced[-1]


def _smallest_stride(expr, variables) -> int | None:
    strides = []
    for v in variables:
        s = static_int(expr.coeff(v))
        if s:
            strides.append(abs(s))
    return min(strides) if strides else None
