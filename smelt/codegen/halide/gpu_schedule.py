"""The GPU schedule of a smelt Halide pipeline (SMELT_CUDA_BACKEND=halide): the same algorithm as
on the CPU, its loops mapped to CUDA blocks and threads.

- Outputs: the update over the kernel's domain runs in blocks of THREADS threads, one element
  each. A (x, r) domain is first fused into one loop (r inner), so a warp's threads take
  neighbouring r: Halide refuses to reorder the RVars of an update, which a 2-D tile would.
- Reductions whose rows lie contiguous in memory: one block per row. The algorithm folds each row
  into `lanes` partial results (lane l takes elements l, l + lanes, ...: halide_reductions._fold),
  one thread per lane, so a warp reads consecutive elements; one thread then folds the partials,
  which Halide keeps in shared memory. Rows in columns (neighbouring outputs side by side): one
  thread per output walks its row, and neighbouring threads read neighbouring elements.
- Scans: one thread per row walks it in order.
- Scatters: one thread in one block, in order, since two positions may be the same element.

Each compute_root Func is a kernel launch of its own inside the pipeline, on the caller's stream.
Every split guards its tail with an if, for the reason halide_schedule.py gives.

Two things Halide 21 cannot print for CUDA shape the algorithm too: a bfloat16 cast (its LLVM
code generator stops on an assertion, killing the process), so GPU kernels hold bfloat16 as 16
bits and convert with the integer math of BF16_HELPERS; and `require` in device code, so indirect
indices are clamped rather than checked (halide.HalideOps.indirect_indexing).
"""
from __future__ import annotations

import dataclasses

from ...symbolic import static_int
from .schedule import GUARD

# Threads of a block for elementwise work: a multiple of the warp, small enough that short
# kernels still spread over the H100's 132 SMs.
THREADS = 256
# Threads (lanes) per row of a contiguous reduction; rows shorter than a warp run one per thread.
MAX_LANES = 256
MIN_LANES = 32

BF16_HELPERS = '''

# bfloat16 as its bits: the upper half of a float32's, rounded to nearest even (NaN: 0x7FC0), as torch.
def f32_to_bf16_bits(v):
    bits = hl.reinterpret(hl.UInt(32), v)
    rounded = (bits + hl.u32(0x7FFF) + ((bits >> 16) & hl.u32(1))) >> 16
    return hl.cast(hl.UInt(16), hl.select(hl.is_nan(v), hl.u32(0x7FC0), rounded))


def bf16_bits_to_f32(b):
    return hl.reinterpret(hl.Float(32), hl.cast(hl.UInt(32), b) << 16)
'''


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclasses.dataclass
class HalideGpuSchedule:
    plan: object
    entries: list[str] = dataclasses.field(default_factory=list)
    gathers: int = 0  # counted by the kernel for the CPU's schedule; GPU threads take one element each
    device = "cuda"
    bf16_as_bits = True

    def __post_init__(self):
        rnumel = static_int(self.plan.rnumel) if self.plan.is_reduction else None
        self.rows_contiguous = self.plan.is_reduction and self.plan.r_contiguous()
        self.lanes = None
        if self.rows_contiguous and (rnumel is None or rnumel >= MIN_LANES):
            self.lanes = MAX_LANES if rnumel is None else min(MAX_LANES, _pow2_at_least(rnumel))
        self.splits = 0

    def _names(self, kind: str, count: int) -> list[str]:
        """Fresh names for the loops a split makes (Halide wants them unique within a stage)."""
        self.splits += 1
        return [f'hl.{kind}("{stem}{self.splits}")' for stem in ("bo", "ti", "bo_y", "ti_y")[:count]]

    def _tile_1d(self, stage: str, var: str, var_kind: str) -> str:
        outer, inner = self._names(var_kind, 2)
        return f"{stage}.gpu_tile({var}, {outer}, {inner}, {THREADS}, {GUARD})"

    def _tile_2d(self, stage: str, inner_var: str, outer_var: str, var_kind: str) -> str:
        rnumel = static_int(self.plan.rnumel)
        across = 32 if rnumel is None else min(THREADS, _pow2_at_least(max(rnumel, 1)))
        block_x, thread_x, block_y, thread_y = self._names(var_kind, 4)
        return (f"{stage}.gpu_tile({inner_var}, {outer_var}, {block_x}, {block_y}, {thread_x}, {thread_y}, "
                f"{across}, {max(1, THREADS // across)}, {GUARD})")

    def _device_only(self, func: str) -> None:
        # An output's pure definition is undef and computes nothing, but left unscheduled it is a
        # host stage, and Halide then demands a host pointer for the output.
        self.entries.append(self._tile_1d(func, "x", "Var"))

    def transpose_tiles(self, xnumel: int, rnumel: int, store_along_r: bool = False, periods=frozenset()) -> None:
        """No register-tiled transposes on the GPU: its stores are tiled as any other."""
        return None

    def row_chunks(self, xnumel: int, rnumel: int, interleave: int, element_size: int) -> None:
        return None  # the GPU's blocks walk x and r as they are

    def note_index(self, index) -> None:
        """Nothing: a GPU thread takes one element, no vector lanes to align."""

    def row_output_domain(self, beside_elements: bool) -> str:
        return "x_dom"  # each output is tiled on its own: no loop nest to share

    def output(self, func: str, domain: str, per_element: bool, along_x: bool = False) -> None:
        # along_x (a transposing store) changes nothing yet: the update is one thread an element.
        self._device_only(func)
        stage = f"{func}.update().allow_race_conditions()"
        if per_element:
            (fused,) = self._names("RVar", 1)
            stage = f"{stage}.fuse({domain}.x, {domain}.y, {fused})"
            self.entries.append(self._tile_1d(stage, fused, "RVar"))
        else:
            self.entries.append(self._tile_1d(stage, f"{domain}.x", "RVar"))

    def reduction(self, func: str, has_update: bool = True) -> None:
        if not has_update:  # the row's value is its lanes folded in the pure definition
            self.entries.append(f"{func}.compute_root().gpu_blocks(x)" if self.lanes is not None
                                else self._tile_1d(f"{func}.compute_root()", "x", "Var"))
            return
        self.entries.append(self._tile_1d(f"{func}.compute_root()", "x", "Var"))
        if self.lanes is not None:
            self.entries.append(f"{func}.update().gpu_blocks(x)")
        else:
            self.entries.append(self._tile_1d(f"{func}.update()", "x", "Var"))

    def row_values(self, func: str) -> None:
        pass  # left inline: each reader computes the value (a row does not stay in one thread here)

    def lane_partials(self, func: str, consumer: str) -> None:
        self.entries.append(f"{func}.compute_at({consumer}, x).gpu_threads(r)")
        self.entries.append(f"{func}.update().gpu_threads(r)")

    def scan(self, func: str) -> None:
        self.entries.append(self._tile_2d(f"{func}.compute_root()", "r", "x", "Var"))
        self.entries.append(self._tile_1d(f"{func}.update()", "x", "Var"))

    def staged(self, func: str, per_element: bool) -> None:
        if per_element:
            self.entries.append(self._tile_2d(f"{func}.compute_root()", "r", "x", "Var"))
        else:
            self.entries.append(self._tile_1d(f"{func}.compute_root()", "x", "Var"))

    def scatter(self, func: str) -> None:
        self._device_only(func)
        self.entries.append(f"{func}.update().gpu_single_thread()")

    def helpers(self) -> str:
        return BF16_HELPERS

    def lines(self) -> list[str]:
        return list(self.entries)
