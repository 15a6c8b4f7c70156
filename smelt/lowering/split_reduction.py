"""How a reduction is computed: the one decision, made in the order below; this module makes the
step that depends on the machine (whether to split), with the backend's Target as an input.

1. **Online softmax** (lowering/online_softmax.py): `amax` and `sum(exp(x - amax))` over the same
   dims become one reduction with two results, whatever the target: a row is read once for both.
2. **Split or not** (here, `choose_split`): a reduction with few outputs over many elements runs
   on few programs (a global sum on one of an H100's 132 SMs; one thread of a CPU's pool). Split,
   its first kernel gives each output `splits` programs, each reducing one chunk of `chunk`
   consecutive reduced elements; a second, small kernel reduces the partials
   (lowering/two_stage_reduction.py builds both). How many programs are enough is the target's
   (smelt/target.py); static sizes only, SMELT_SPLIT_REDUCTIONS=0 turns it off.
3. **In the kernel**, once fusion has fixed its members (each backend's own choice, from the
   kernel plan): a row up to SMELT_PERSISTENT_REDUCTION_LIMIT stays in registers (persistent),
   a longer one is looped over; Triton on a GPU keeps a row of up to 512k float32 in the registers
   of several programs that meet at a barrier (codegen/triton/row_split.py); Halide computes a
   reduction inside its consumer's loop over a chunk of rows (codegen/halide/schedule.py).
4. **Finisher** (scheduler/finishers.py): a split's second stage, when small, runs in the first
   kernel's last program where the backend can (`Backend.finishes_reductions`: Triton's).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy

from ..config import Config
from ..ir.ops import ReadsHandler, use_handler
from ..symbolic import index_var, next_power_of_2, static_int
from ..target import Target

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


def choose_split(outputs, reduction_numel, reads_columns: Callable[[], bool], config: Config,
                 target: Target) -> Split | None:
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
                                                                         target.global_split_min_numel)
    # Split only when that at least doubles the number of programs: with more than half the
    # target already running, the gain is smaller than the cost of a second launch.
    if programs > target.split_programs // 2 or per_program * numel < min_numel:
        return None
    wanted = (target.split_programs if columns else target.row_split_programs) // programs
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
