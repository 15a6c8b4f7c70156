"""The default schedule of a smelt Halide pipeline: how its Funcs run, apart from what they compute.

Outputs are written by an update over the kernel's domain: its outer loop (x) runs on Halide's
thread pool in chunks, its inner loop is vectorized along the dimension the store walks
contiguously. Stores never overlap, which Halide cannot prove through an index expression: the
update is marked race-free by hand. Scatters run in order: positions may repeat.

Reductions and scans are computed where their one consumer needs them: inside the output's loop
over a chunk of rows, so a row is read from memory once and its later passes (a softmax's max,
sum and output) find it in cache. When several outputs read them, Halide needs one loop nest
enclosing every consumer: they are then computed once, in full, before the outputs
(compute_root), parallel over x.

Every split guards its tail with an if (GUARD): loads promise bounds inference that their index
lies inside the buffer, which holds only for points of the kernel's domain; a rounded-up tail
would compute points past it and read past the end.
"""
from __future__ import annotations

import dataclasses

import sympy

# Lanes of a vector loop: a 512-bit vector of float32 (Halide splits it on narrower machines).
VECTOR = 16
# Rows of x one thread-pool task takes: enough work to pay for the task's start.
ROWS_PER_TASK = 8
# Elements of a 1-D output one task takes.
ELEMENTS_PER_TASK = 4096
# Columns of a transposing store one task walks down together: each row of the transposed read
# then gives a whole cache line (measured on the 2-core CPU, 2048x2048 x.t() + y: 32 columns
# 2.8 ms, 16 columns 3.3 ms, one vector along r 29 ms).
COLUMNS_PER_TASK = 32

# Rows a scan runs side by side (a vector of them); 16 measured slower than 8.
SCAN_ROWS = 8

GUARD = "hl.TailStrategy.GuardWithIf"
# An output's store loop takes four registers a step where its extent is known to fill them with
# little tail: their exp or division chains overlap (silu_mul 2048x2048, one thread 2.19 -> 1.92
# ms; rms_norm 1.26 -> 1.15 ms).
WIDE_VECTOR = 4 * VECTOR
# Partial results per row a contiguous row reduction keeps: four vectors, so four independent
# chains of adds overlap (one vector: 2048x2048 row sum 1.9 ms, four: see RESULTS.md).
LANES = 4 * VECTOR


def static_extent(extent) -> int | None:
    """extent as an int where the graph's shapes fix it."""
    extent = sympy.sympify(extent) if extent is not None else None
    return int(extent) if extent is not None and extent.is_Integer else None


@dataclasses.dataclass
class _Output:
    func: str
    domain: str
    per_element: bool
    along_x: bool  # the store is contiguous along x (a transposing store), not along r
    rows_per_task: int | None  # a reduction's one value per row: rows per task, each costs a row's work
    row_at_a_time: bool  # reductions along contiguous rows: computed row by row, the row stays in L1
    vector: int = VECTOR  # lanes of the contiguous store loop

    def loop(self, whole_task: bool = False) -> str:
        """The loop a reduction computed inside the output is computed at: one row, or one task."""
        if self.per_element and self.along_x:
            return f"{self.func}_columns"
        return f"{self.func}_row" if self.row_at_a_time and not whole_task else f"{self.func}_rows"

    def lines(self) -> list[str]:
        stage = f"{self.func}.update().allow_race_conditions()"
        d = self.domain
        if self.per_element and self.along_x:
            # The vectorized loop is outside the loop over r: Halide vectorizes the body of the r
            # loop, which it may not move inside (reordering an update's RVars needs a proof it
            # cannot make).
            columns, column = f"{self.func}_columns", f"{self.func}_column"
            return [f'{columns}, {column} = hl.RVar("{columns}"), hl.RVar("{column}")',
                    f"{stage}.split({d}.y, {columns}, {column}, {COLUMNS_PER_TASK}, {GUARD})"
                    f".vectorize({column}, {VECTOR}).parallel({columns})"]
        if not self.per_element and not self.rows_per_task:
            return [f"{stage}.vectorize({d}.x, {self.vector}, {GUARD}).parallel({d}.x, {ELEMENTS_PER_TASK}, {GUARD})"]
        rows, row = f"{self.func}_rows", f"{self.func}_row"
        declare = f'{rows}, {row} = hl.RVar("{rows}"), hl.RVar("{row}")'
        if not self.per_element:
            return [declare, f"{stage}.split({d}.x, {rows}, {row}, {self.rows_per_task}, {GUARD}).parallel({rows})"]
        return [declare, f"{stage}.split({d}.y, {rows}, {row}, {ROWS_PER_TASK}, {GUARD})"
                         f".vectorize({d}.x, {self.vector}, {GUARD}).parallel({rows})"]


@dataclasses.dataclass
class HalideSchedule:
    plan: object
    entries: list[str] = dataclasses.field(default_factory=list)  # Funcs placed in lines(): reductions, scans
    outputs: list[_Output] = dataclasses.field(default_factory=list)
    computed: list[tuple[str, bool, bool]] = dataclasses.field(default_factory=list)  # (Func, across x, has an update)
    stored_rows: list[str] = dataclasses.field(default_factory=list)
    scans: list[str] = dataclasses.field(default_factory=list)
    scatters: int = 0
    device = "cpu"  # the target the schedule is for (halide_gpu_schedule: cuda)
    bf16_as_bits = False  # bfloat16 is a Halide type on the CPU

    def helpers(self) -> str:
        """Module-level helpers the schedule's kernels need (none on the CPU)."""
        return ""

    def __post_init__(self):
        # Rows contiguous in memory: fold each row into vector lanes first. Otherwise (columns)
        # neighbouring outputs lie side by side: vectorize across x.
        self.rows_contiguous = self.plan.is_reduction and self.plan.r_contiguous()
        self.lanes = LANES if self.rows_contiguous else None

    def output(self, func: str, domain: str, per_element: bool, along_x: bool = False) -> None:
        rows = None
        if self.plan.is_reduction:
            # Columns reduce vectorized across x: a task then takes a vector of them per row.
            rows = ROWS_PER_TASK if self.rows_contiguous else ROWS_PER_TASK * VECTOR
        extent = static_extent(self.plan.rnumel if per_element else self.plan.xnumel)
        wide = extent is not None and (extent % WIDE_VECTOR == 0 or extent >= 16 * WIDE_VECTOR)
        self.outputs.append(_Output(func, domain, per_element, along_x, rows, self.rows_contiguous,
                                    WIDE_VECTOR if wide else VECTOR))

    def reduction(self, func: str, has_update: bool = True) -> None:
        self.computed.append((func, not self.rows_contiguous, has_update))

    def lane_partials(self, func: str, consumer: str) -> None:
        self.entries.append(f"{func}.compute_at({consumer}, x).vectorize(r)")
        self.entries.append(f"{func}.update().vectorize(r)")

    def row_values(self, func: str) -> None:
        """A value per (r, x) that a reduction and the output both read: stored per task, when the
        task holds every reader; otherwise left inline (computed by each)."""
        self.stored_rows.append(func)

    def scan(self, func: str) -> None:
        self.scans.append(func)

    def staged(self, func: str, per_element: bool) -> None:
        if per_element:
            self.entries.append(f"{func}.compute_root().vectorize(r, {VECTOR}, {GUARD}).parallel(x, {ROWS_PER_TASK}, {GUARD})")
        else:
            self.entries.append(f"{func}.compute_root().vectorize(x, {VECTOR}, {GUARD})"
                                f".parallel(x, {ELEMENTS_PER_TASK}, {GUARD})")

    def scatter(self, func: str) -> None:
        self.scatters += 1  # serial: two positions may be the same element

    def _placement(self, func: str, across: bool, has_update: bool, vector: str | None = None) -> list[str]:
        whole_task = vector is not None  # a scan's rows run side by side: the task's rows, together
        if vector is None:
            vector = f".vectorize(x, {VECTOR}, {GUARD})" if across else ""
        if len(self.outputs) == 1 and not self.scatters:
            out = self.outputs[0]
            where, then = f".compute_at({out.func}, {out.loop(whole_task)}){vector}", vector
        else:
            parallel = f".parallel(x, {ROWS_PER_TASK}, {GUARD})"
            where, then = f".compute_root(){vector}{parallel}", f"{vector}{parallel}"
        return [f"{func}{where}"] + ([f"{func}.update(){then}"] if has_update and then else [])

    def lines(self) -> list[str]:
        lines = list(self.entries)
        for out in self.outputs:
            lines += out.lines()  # first: a placement below may name the loop variables they declare
        for func, across, has_update in self.computed:
            lines += self._placement(func, across, has_update)
        for func in self.scans:
            # A scan is a chain of dependent steps along r: its rows run side by side, a vector
            # across x, stored with x innermost so each step's vector is contiguous (2048x2048
            # cumsum, one thread: 6.3 ms one row at a time, 4.6 ms eight rows side by side).
            lines += [f"{func}.reorder_storage(x, r)"]
            lines += self._placement(func, True, True, f".vectorize(x, {SCAN_ROWS}, {GUARD})")
        if len(self.outputs) == 1 and not self.scatters:
            out = self.outputs[0]
            lines += [f"{func}.compute_at({out.func}, {out.loop()}).vectorize(r, {VECTOR}, {GUARD})"
                      for func in self.stored_rows]
        return lines
