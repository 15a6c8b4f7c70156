"""The default schedule of a smelt Halide pipeline: how its Funcs run, apart from what they compute.

Outputs are written by an update over the kernel's domain: its outer loop (x) runs on Halide's
thread pool in chunks, its inner loop is vectorized (r for a value per (x, r), x otherwise).
Stores never overlap, which Halide cannot prove through an index expression: the update is
marked race-free by hand. Reductions and scans are computed once, in full, before the outputs
that read them (compute_root), parallel over x. Scatters run in order: positions may repeat.

Every split guards its tail with an if (GUARD): loads promise bounds inference that their index
lies inside the buffer, which holds only for points of the kernel's domain; a rounded-up tail
would compute points past it and read past the end.
"""
from __future__ import annotations

import dataclasses

# Lanes of a vector loop: a 512-bit vector of float32 (Halide splits it on narrower machines).
VECTOR = 16
# Rows of x one thread-pool task takes: enough work to pay for the task's start.
ROWS_PER_TASK = 8
# Elements of a 1-D output one task takes.
ELEMENTS_PER_TASK = 4096


GUARD = "hl.TailStrategy.GuardWithIf"
# Partial results per row a contiguous row reduction keeps, one per vector lane.
LANES = 16


@dataclasses.dataclass
class HalideSchedule:
    plan: object
    entries: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        # Rows contiguous in memory: fold each row into vector lanes first. Otherwise (columns)
        # neighbouring outputs lie side by side: vectorize across x.
        self.rows_contiguous = self.plan.is_reduction and self.plan.r_contiguous()
        self.lanes = LANES if self.rows_contiguous else None

    def output(self, func: str, domain: str, per_element: bool) -> None:
        stage = f"{func}.update().allow_race_conditions()"
        if per_element:
            self.entries.append(f"{stage}.vectorize({domain}.x, {VECTOR}, {GUARD})"
                                f".parallel({domain}.y, {ROWS_PER_TASK}, {GUARD})")
        else:
            self.entries.append(f"{stage}.vectorize({domain}.x, {VECTOR}, {GUARD})"
                                f".parallel({domain}.x, {ELEMENTS_PER_TASK}, {GUARD})")

    def reduction(self, func: str) -> None:
        across = "" if self.rows_contiguous else f".vectorize(x, {VECTOR}, {GUARD})"
        self.entries.append(f"{func}.compute_root(){across}.parallel(x, {ROWS_PER_TASK}, {GUARD})")
        self.entries.append(f"{func}.update(){across}.parallel(x, {ROWS_PER_TASK}, {GUARD})")

    def lane_partials(self, func: str, consumer: str) -> None:
        self.entries.append(f"{func}.compute_at({consumer}, x).vectorize(r)")
        self.entries.append(f"{func}.update().vectorize(r)")

    def scan(self, func: str) -> None:
        self.entries.append(f"{func}.compute_root().parallel(x, {ROWS_PER_TASK}, {GUARD})")
        self.entries.append(f"{func}.update().parallel(x, {ROWS_PER_TASK}, {GUARD})")

    def staged(self, func: str, per_element: bool) -> None:
        if per_element:
            self.entries.append(f"{func}.compute_root().vectorize(r, {VECTOR}, {GUARD}).parallel(x, {ROWS_PER_TASK}, {GUARD})")
        else:
            self.entries.append(f"{func}.compute_root().vectorize(x, {VECTOR}, {GUARD})"
                                f".parallel(x, {ELEMENTS_PER_TASK}, {GUARD})")

    def scatter(self, func: str) -> None:
        pass  # serial: two positions may be the same element

    def lines(self) -> list[str]:
        return list(self.entries)
