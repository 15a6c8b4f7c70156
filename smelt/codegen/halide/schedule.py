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

A transposing store of static extents (out[X*r + x] = f(in[r + R*x], ...)) walks square tiles: the
inputs contiguous along r are loaded a tile at a time into registers and transposed there, and a
thread takes a strip of several hundred columns down all rows (see TransposeTiles).

Every split guards its tail with an if (GUARD): loads promise bounds inference that their index
lies inside the buffer, which holds only for points of the kernel's domain; a rounded-up tail
would compute points past it and read past the end.
"""
from __future__ import annotations

import dataclasses
import functools

from ...scheduler.nodes import XINDEX
from ...symbolic import FloorDiv, ModularIndexing, static_int

# Lanes of a vector loop: a 512-bit vector of float32 (Halide splits it on narrower machines).
VECTOR = 16
# Rows of x one thread-pool task takes: enough work to pay for the task's start.
ROWS_PER_TASK = 8
# Elements a task of a per-element row output takes where the sizes are static: fewer, larger
# tasks claim the pool less often (2 threads, rows of 2048, 8 -> 32 rows a task: softmax 1.58 ->
# 1.46 ms, rms_norm 0.85 -> 0.76 ms), while at least MIN_TASKS remain to balance.
TASK_ELEMENTS = 65536
MIN_TASKS = 16
LONG_ROW = 8192  # elements: such a row is a task's worth alone (the task rows' rule in output())
# Elements of a 1-D output one task takes (2 cores, a [512, 688] multiply alone, tasks dealt
# dynamically: 4096 a task 70 us, 16384 65 us; dealt statically as now, both about 48; ATen 35:
# `python -m benchmarks.probes.halide_pointwise --elements-per-task N [--omp-schedule "dynamic, 1"]`).
ELEMENTS_PER_TASK = 16384


def vectors_per_task(lanes: int) -> int:
    """The split of a loop already vectorized by `lanes` that gives ELEMENTS_PER_TASK a task:
    vectorize(x, n) leaves x counting vectors, so parallel(x, k) makes tasks of k * n elements.
    (Split by the element count itself, a task took 64 x 4096 elements: every 1-D kernel under
    262,144 elements ran on one thread, a [512, 688] multiply 95 us against ATen's 31.)"""
    return max(1, ELEMENTS_PER_TASK // lanes)
# Columns of a transposing store one task walks down together: each row of the transposed read
# then gives a whole cache line (measured on the 2-core CPU, 2048x2048 x.t() + y: 32 columns
# 2.8 ms, 16 columns 3.3 ms, one vector along r 29 ms).
COLUMNS_PER_TASK = 32

# A transposing store's tile: TILE x TILE elements, transposed in registers. 8, not 16: LLVM's
# shuffles for a 16x16 float32 tile cost twice those of four 8x8 ones (256x256 x.t() + y in L2:
# 35 vs 18 us); at 2048x2048 the two are within the machine's noise.
TILE = 8
# Where 8 does not divide both extents or a period, tiles of 4 (one thread: [4, 256, 14, 14]
# channels-last copied back to NCHW 232 -> 91 us, Inductor 86; x.t() + y over [196, 1024] in
# column strips 164 us, in tiles of 4 129, Inductor 119), and none below.
MIN_TILE = 4
# Widest strip of columns one thread takes down all rows: each row of the transposed input then
# gives a cache line per tile, the strip's rows stay few enough for the L2 TLB, and the other side
# reads rows of STRIP_COLUMNS elements (2048x2048 x.t() + y, one thread: strips of 32 columns
# 5.5 ms, 512 or 1024 columns 3.6 ms, all 2048 5.7 ms; two threads 512 beat 1024).
STRIP_COLUMNS = 512
# Narrower strips read their rows in pieces too short for the prefetcher (32 columns: 11 ms).
MIN_STRIP_COLUMNS = 128
# Strips a transposing store needs to run them as its thread-pool tasks ([4, 256, 14, 14] copied
# to channels-last is one strip of 256 channels).
MIN_STRIPS = 8

# Rows a scan runs side by side (a vector of them); 16 measured slower than 8.
SCAN_ROWS = 8

GUARD = "hl.TailStrategy.GuardWithIf"
# An output's store loop takes four registers a step where its extent is known to fill them with
# little tail: their exp or division chains overlap (silu_mul 2048x2048, one thread 2.19 -> 1.92
# ms; rms_norm 1.26 -> 1.15 ms).
WIDE_VECTOR = 4 * VECTOR
# Masked or indirect loads (gathers) a store loop may take and still get WIDE_VECTOR: LLVM's compile
# time grows steeply with a gather's width (a 5x5 depthwise window over 192 channels, 25 of them:
# 1.7 s at 8 lanes, 2.8 at 16, 15.9 at 32, past 7 minutes at 64).
WIDE_GATHERS = 4
# Partial results per row a contiguous row reduction keeps: four vectors, so four independent
# chains of adds overlap (one vector: 2048x2048 row sum 1.9 ms, four: see RESULTS.md).
LANES = 4 * VECTOR


# The narrowest vector a period may ask for: below it the loop keeps its full width (gathers).
MIN_ALIGNED_LANES = 4


@functools.lru_cache(maxsize=None)
def across_x_lanes() -> int:
    """Lanes of a loop vectorized across x: one register of float32. Such a loop keeps a vector
    of each live value per lane group (a reduction's accumulators, a row's batch-norm terms), and
    two registers each spill on AVX2's sixteen: a channels-last hard-swish and mean over
    [4, 240, 14, 14], 16 lanes 90 us, 8 lanes 73; over [4, 576, 7, 7], 76 and 59 (2-core AVX2 CPU).
    Without the halide package (a GPU machine) a kernel's source is still written, for AVX2."""
    try:
        import halide as hl
    except ImportError:
        return VECTOR // 2
    host = hl.get_host_target()
    return VECTOR if host.has_feature(hl.TargetFeature.AVX512) else VECTOR // 2


def periods_along(index, var) -> set[int]:
    """The static periods after which `index` stops walking `var` contiguously: d of each var // d
    and var % d (a channels-last reduction's per-element store: x = n * C + c walks c = x % C)."""
    periods = set()
    for term in index.atoms(FloorDiv, ModularIndexing):
        if term.args[0] != var:
            continue
        if isinstance(term, ModularIndexing) and term.args[1] == 1:
            period = term.args[2]  # var % d
        else:
            period = term.args[1]  # var // d, and (var // m) % d, which holds still for m steps
        if static_int(period) is not None:
            periods.add(static_int(period))
    return periods


def aligned_lanes(periods, widest: int) -> int:
    """Lanes of a vector loop whose aligned vectors never straddle a multiple of any period: the
    largest power of two up to `widest` dividing them all. Across a straddle Halide cannot prove
    a vector's addresses consecutive and gathers every lane: [4, 120, 14, 14] channels-last,
    batch norm, hard-swish and mean, 16 lanes 123 us, 8 lanes 37 (2-core AVX2 CPU)."""
    lanes = widest
    while lanes > 1 and any(p % lanes for p in periods):
        lanes //= 2
    return lanes if lanes >= MIN_ALIGNED_LANES else widest


def _row_lanes(rnumel: int | None) -> int:
    """Lane partials for a row: LANES, or for a static row shorter than that the power of two
    at least its length, so no lane is wasted. Also a workaround: Halide 21's LLVM miscompiles
    a 2-element float64 row folded in 8 or more lanes (the clamped tail's load of [a0, a1]
    broadcast to [a0, a1, a1, ...] becomes vmovddup [a0, a0] under AVX-512)."""
    lanes = 1
    while rnumel is not None and lanes < min(rnumel, LANES):
        lanes *= 2
    return LANES if rnumel is None else lanes

# r positions a chunk of an interleaving store takes (RowChunks), every row of x written for them
# before the next chunk; rows x chunk elements stay within CHUNK_BYTES (L1 and some of L2).
CHUNK = 64
CHUNK_BYTES = 64 * 1024
# Widest interleave (the store's step along r) taken as one: beyond it a cache line holds one r.
MAX_INTERLEAVE = 16
# Chunks one thread-pool task takes.
CHUNKS_PER_TASK = 16


@dataclasses.dataclass(frozen=True)
class RowChunks:
    """How a store that interleaves its rows (out[s * r + f(x)], 1 < s <= MAX_INTERLEAVE: a
    channels-last copy of a few channels, each row one channel) walks its (r, x) domain: a chunk
    of r along every row, then the next chunk; innermost first: the chunk's column, the row, the
    chunk. An output cache line is then finished by the rows' stores while it is in L1. Walked a
    row at a time down all of r (the default), each line is written s times, far apart: a
    [4, 16, 112, 112] channels-last copy on 2 cores 346-390 -> 174-188 us (eager 230-390); with 3
    channels, even (131-148 against 135-136 us; `python -m benchmarks.probes.channels_last_copy`).

    Where s divides the rows, the row is split as x = s * group + lane and the s rows of a group
    are unrolled: their s strided stores of one chunk land side by side, and Halide joins them into
    one dense store of interleaved vectors (one thread: [4, 3, 224, 224] 206 -> 177 us, [4, 8,
    112, 112] 160 -> 136, [4, 16, 112, 112] 684 -> 433; `halide_kernel_variants`). The groups (an
    image each) are walked outside the chunks, the two loops fused into the tasks' loop: a task
    then reads s rows of one image and writes one run, where with the groups inside the chunks it
    read every image's rows at once (MobileNetV3's [4, 3, 224, 224] input, 2 cores: 106 -> 88 us
    warm, 436 -> 319 us with the caches evicted)."""

    chunk: int
    xnumel: int
    rnumel: int
    interleave: int = 1  # s where it divides xnumel: rows unrolled by groups of s; else 1
    transposes_loads = False

    def extents(self) -> list[int]:
        if self.interleave > 1:
            s = self.interleave
            return [self.chunk, s, self.rnumel // self.chunk, self.xnumel // s]
        return [self.chunk, self.xnumel, self.rnumel // self.chunk]

    def coordinates(self, dom: str) -> tuple[str, str]:
        if self.interleave > 1:
            return f"({dom}[3] * {self.interleave} + {dom}[1])", f"({dom}[2] * {self.chunk} + {dom}[0])"
        return f"{dom}[1]", f"({dom}[2] * {self.chunk} + {dom}[0])"

    def lines(self, stage: str, dom: str) -> list[str]:
        if self.interleave > 1:
            # Measured, one thread (AVX-512 Xeon): 2 or 3 rows interleave fastest from whole
            # chunks, 4 to 16 from TILE lanes each (8 lanes 136 us, 16 lanes 153 at 8 rows).
            lanes = self.chunk if self.interleave < 4 else TILE
            tasks = f"{dom}_chunk_of_group"
            return [f'{tasks} = hl.RVar("{tasks}")',
                    f"{stage}.vectorize({dom}[0], {lanes}).unroll({dom}[1])"
                    f".fuse({dom}[2], {dom}[3], {tasks}).parallel({tasks}, {CHUNKS_PER_TASK}, {GUARD})"]
        return [f"{stage}.vectorize({dom}[0]).parallel({dom}[2], {CHUNKS_PER_TASK}, {GUARD})"]


def row_chunks(xnumel: int, rnumel: int, interleave: int, element_size: int) -> RowChunks | None:
    """The chunks of an interleaving store over static extents, or None where the store does not
    interleave, a chunk's rows would not stay in cache, or chunks do not divide r."""
    if not 1 < interleave <= MAX_INTERLEAVE or rnumel % CHUNK or xnumel * CHUNK * element_size > CHUNK_BYTES:
        return None
    return RowChunks(CHUNK, xnumel, rnumel, interleave if xnumel % interleave == 0 else 1)


@dataclasses.dataclass(frozen=True)
class TransposeTiles:
    """How a transposing store walks its (r, x) domain: the update's RDom has five dimensions,
    innermost first: a tile's column and row, the tile along the store's contiguous dim within a
    strip, the tile along the other dim, the strip. Halide may not reorder an update's RVars (it
    cannot prove the store races nowhere), so the order is the RDom's own.

    The store walks x and the tiled loads r (out[X*r + x] = f(in[r + R*x])), or, with
    store_along_r, the store walks r and the tiled loads x (a channels-last tensor copied back to
    NCHW: out[r + HW*x] = f(in[C*r + CHW*(x // C) + x % C]); [4, 64, 56, 56] on one thread 1092
    -> 384 us, Inductor 383: its loads were gathers)."""

    tile: int
    strip_tiles: int  # tiles along the store's contiguous dim one strip (one thread-pool task) takes
    xnumel: int
    rnumel: int
    store_along_r: bool = False
    transposes_loads = True  # loads contiguous along the other dim are register tiles, read transposed

    def extents(self) -> list[int]:
        t = self.tile
        columns, rows = (self.rnumel, self.xnumel) if self.store_along_r else (self.xnumel, self.rnumel)
        return [t, t, self.strip_tiles, rows // t, columns // (t * self.strip_tiles)]

    def coordinates(self, dom: str) -> tuple[str, str]:
        """(x, r) of a point of the RDom named dom."""
        t, strip = self.tile, self.tile * self.strip_tiles
        column, row = f"({dom}[4] * {strip} + {dom}[2] * {t} + {dom}[0])", f"({dom}[3] * {t} + {dom}[1])"
        return (row, column) if self.store_along_r else (column, row)

    def load_axes(self) -> tuple[str, str]:
        """(the dim a tiled load walks contiguously, the dim it strides along), as pure vars."""
        return ("x", "r") if self.store_along_r else ("r", "x")

    def lines(self, stage: str, dom: str) -> list[str]:
        # Tasks are strips; too few strips to share among threads, the rows of tiles instead.
        tasks = 4 if self.extents()[4] >= MIN_STRIPS else 3
        return [f"{stage}.vectorize({dom}[0]).unroll({dom}[1]).parallel({dom}[{tasks}])"]


def transpose_tiles(xnumel: int, rnumel: int, store_along_r: bool = False,
                    periods: frozenset[int] = frozenset()) -> TransposeTiles | None:
    """The tiling of a transposing store over static extents, or None where the tiles do not
    divide them or the strips would be too narrow (the column-strip schedule stays). `periods`:
    those of the tiled loads along the dim they walk (x % C), which a tile must not straddle (its
    rows would be gathers)."""
    def fits(tile):
        return not (xnumel % tile or rnumel % tile or any(p % tile for p in periods))
    tile = TILE
    while tile > MIN_TILE and not fits(tile):
        tile //= 2
    if not fits(tile):
        return None
    tiles = (rnumel if store_along_r else xnumel) // tile
    strip_tiles = max(d for d in range(1, tiles + 1) if tiles % d == 0 and d * tile <= STRIP_COLUMNS)
    if strip_tiles * tile < MIN_STRIP_COLUMNS:
        return None
    return TransposeTiles(tile, strip_tiles, xnumel, rnumel, store_along_r)


# The RDom a per-row output walks where the kernel also stores per element (a training layer
# norm's rstd beside its normed rows), so it can join their loop nest (HalideSchedule.row_group):
# compute_with fuses loops only of the same name and kind. Named as xr_dom, its split row loop
# has their rows' name; its one-element r, added to the store index (always 0), makes that loop
# an ImpureRVar as theirs is: Halide proves a store at the row alone race-free (a PureRVar) but
# not one at r + R*x, and refuses to fuse the two kinds.
ROW_DOMAIN = "row_dom"
ROW_DOMAIN_DECLARATION = 'row_dom = hl.RDom([(0, 1), (0, xnumel)], "xr_dom")'


@dataclasses.dataclass
class _Output:
    func: str
    domain: str
    per_element: bool
    along_x: bool  # the store is contiguous along x (a transposing store), not along r
    rows_per_task: int | None  # a reduction's one value per row: rows per task, each costs a row's work
    row_at_a_time: bool  # reductions along contiguous rows: computed row by row, the row stays in L1
    vector: int = VECTOR  # lanes of the contiguous store loop
    task_rows: int = ROWS_PER_TASK  # rows a thread-pool task takes (per-element outputs)
    tiles: TransposeTiles | RowChunks | None = None  # a store walking tiles or chunks (domain is their RDom)
    x_lanes: int = VECTOR  # lanes of a loop vectorized across x: HalideSchedule.x_lanes
    fused_into: _Output | None = None  # the output whose row loop this one's runs in (HalideSchedule.row_group)

    @property
    def walks_rows(self) -> bool:
        """Whether the store's loop nest is rows of x split into tasks: a row's elements along r, or a
        contiguous row reduction's one value per row. Such outputs can share one loop nest."""
        if self.per_element:
            return not self.along_x and not self.tiles
        return bool(self.rows_per_task) and self.row_at_a_time

    @property
    def split_rows(self) -> int:
        """Rows of x a thread-pool task takes."""
        return self.task_rows if self.per_element else self.rows_per_task

    def loop(self, whole_task: bool = False) -> str:
        """The loop a reduction computed inside the output is computed at: one row, or one task."""
        if self.per_element and self.along_x:
            return f"{self.domain}[2]" if self.tiles else f"{self.func}_columns"
        return f"{self.func}_row" if self.row_at_a_time and not whole_task else f"{self.func}_rows"

    def lines(self) -> list[str]:
        stage = f"{self.func}.update().allow_race_conditions()"
        d = self.domain
        if self.tiles:
            return self.tiles.lines(stage, d)
        if self.per_element and self.along_x:
            # The vectorized loop is outside the loop over r: Halide vectorizes the body of the r
            # loop, which it may not move inside (reordering an update's RVars needs a proof it
            # cannot make).
            columns, column = f"{self.func}_columns", f"{self.func}_column"
            return [f'{columns}, {column} = hl.RVar("{columns}"), hl.RVar("{column}")',
                    f"{stage}.split({d}.y, {columns}, {column}, {COLUMNS_PER_TASK}, {GUARD})"
                    f".vectorize({column}, {self.x_lanes}).parallel({columns})"]
        if not self.per_element and not self.rows_per_task:
            return [f"{stage}.vectorize({d}.x, {self.vector}, {GUARD}).parallel({d}.x, {vectors_per_task(self.vector)}, "
                    f"{GUARD})"]
        if self.fused_into is not None and self.fused_into.along_x:
            # A column group's per-column output: the leader's task loop, by name (compute_with
            # matches loops by their names).
            columns, column = f"{self.fused_into.func}_columns", f"{self.fused_into.func}_column"
            return [f"{stage}.split({d}.y, {columns}, {column}, {COLUMNS_PER_TASK}, {GUARD})"
                    f".vectorize({column}, {self.x_lanes}).parallel({columns})",
                    f"{self.func}.update().compute_with({self.fused_into.func}.update(), {columns})"]
        rows_var = f"{d}.y" if self.per_element or d == ROW_DOMAIN else f"{d}.x"
        rows, row = f"{self.func}_rows", f"{self.func}_row"
        declare = [f'{rows}, {row} = hl.RVar("{rows}"), hl.RVar("{row}")']
        split_rows = self.split_rows
        if self.fused_into:
            # The leading output's loop variables, by name, and its rows a task: compute_with
            # matches loops by their names and needs the same loops down to the fused one.
            leader = self.fused_into.func
            rows, row, declare, split_rows = f"{leader}_rows", f"{leader}_row", [], self.fused_into.split_rows
        split = f"{stage}.split({rows_var}, {rows}, {row}, {split_rows}, {GUARD})"
        if self.per_element:
            split += f".vectorize({d}.x, {self.vector}, {GUARD})"
        fused = [f"{self.func}.update().compute_with({self.fused_into.func}.update(), {row})"] if self.fused_into else []
        return declare + [f"{split}.parallel({rows})"] + fused


@dataclasses.dataclass
class HalideSchedule:
    plan: object
    entries: list[str] = dataclasses.field(default_factory=list)  # Funcs placed in lines(): reductions, scans
    outputs: list[_Output] = dataclasses.field(default_factory=list)
    # (Func, across x, has an update, the RVar its update walks)
    computed: list[tuple[str, bool, bool, str]] = dataclasses.field(default_factory=list)
    stored_rows: list[str] = dataclasses.field(default_factory=list)
    scans: list[str] = dataclasses.field(default_factory=list)
    scatters: int = 0
    gathers: int = 0  # masked or indirect loads in the kernel (kernel.py's load_clamped)
    tile_loads: list[str] = dataclasses.field(default_factory=list)  # loads transposed in registers
    piece_lines: list[str] = dataclasses.field(default_factory=list)  # a kernel printed in pieces (pieces.py)
    blocked: list[tuple[list[str], str]] = dataclasses.field(default_factory=list)  # blocked scans' Funcs
    x_periods: set[int] = dataclasses.field(default_factory=set)  # see note_index
    writes_in_place: bool = False  # an output overwrites an input (kernel.py's write_in_place)
    # Per-row outputs join per-element ones through ROW_DOMAIN; off in a kernel's plain form (Halide
    # refused it once: a later Halide may see through ROW_DOMAIN's zero and refuse the fusion).
    rows_join_elements: bool = True
    device = "cpu"  # the target the schedule is for (halide_gpu_schedule: cuda)
    bf16_as_bits = False  # bfloat16 is a Halide type on the CPU

    def helpers(self) -> str:
        """Module-level helpers the schedule's kernels need (none on the CPU)."""
        return ""

    def __post_init__(self):
        # Rows contiguous in memory: fold each row into vector lanes first. Otherwise (columns)
        # neighbouring outputs lie side by side: vectorize across x.
        self.rows_contiguous = self.plan.is_reduction and self.plan.r_contiguous()
        self.lanes = _row_lanes(self.plan.static_sizes()[1]) if self.rows_contiguous else None

    def transpose_tiles(self, xnumel: int, rnumel: int, store_along_r: bool = False,
                        periods: frozenset[int] = frozenset()) -> TransposeTiles | None:
        return transpose_tiles(xnumel, rnumel, store_along_r, periods)

    def note_index(self, index) -> None:
        """An index the kernel loads or stores at: its periods along x bound the lanes of loops
        vectorized across x."""
        self.x_periods |= periods_along(index, XINDEX)

    @property
    def x_lanes(self) -> int:
        return aligned_lanes(self.x_periods, across_x_lanes())

    def _loop_nest(self) -> _Output | None:
        """The output whose loop nest every output of the kernel runs in: the only one, or the
        leader of a row group (row_group); None where each output walks its own."""
        if self.scatters:
            return None
        if len(self.outputs) == 1:
            return self.outputs[0]
        return self._leader() if self.row_group() or self.column_group() else None

    def _leader(self) -> _Output:
        """A row group's output whose loops the others join: the first that stores per element (its
        row loop is the one a row's values are computed in, vectorized along r), else the first."""
        return next((o for o in self.outputs if o.per_element), self.outputs[0])

    def row_group(self) -> bool:
        """Whether the kernel's outputs all store row by row over the same rows, so they run in one
        loop nest (compute_with at the row): a row is read once for all of them, and a reduction any
        of them reads is computed inside it, a row at a time. Computed in full before separate output
        loops, a residual add + RMSNorm over [512, 256] read its inputs three times in three parallel
        loops: 42 us against 27 (2-core CPU). A row's own results (a training layer norm's saved
        rstd) join too, one value stored per row: apart, they forced the statistics into a pass of
        their own before every output, and each output loop recomputed the row (a residual add +
        LayerNorm [512, 768], training forward, one thread: the kernel 457 -> 238 us). Not where an
        output overwrites an input: another output's row could read an element a row before it
        already overwrote."""
        return len(self.outputs) > 1 and not self.scatters and not self.writes_in_place \
            and (self.rows_contiguous or not self.plan.is_reduction) \
            and all(o.walks_rows for o in self.outputs) \
            and (self.rows_join_elements or len({o.per_element for o in self.outputs}) == 1)

    def column_group(self) -> bool:
        """Whether a column reduction's outputs run in the loop nest of its one per-element output,
        stored along x (a channels-last batch norm + hard-swish, and its mean per channel: the
        squeeze-excite of a mobile net): each task of columns reduces its columns, then stores their
        elements from cache, then their per-column results (compute_with at the task, through
        ROW_DOMAIN as a row group does). Apart, the elements and the sums were two passes over the
        input: [4, 240, 14, 14] on 2 cores, interleaved, 87 -> 72 and 104 -> 87 us warm, 192 -> 173
        with the caches evicted (the elements alone 58-61 us; `halide_kernel_variants`)."""
        elements = [o for o in self.outputs if o.per_element]
        return len(self.outputs) > 1 and not self.scatters and not self.writes_in_place and self.rows_join_elements \
            and self.plan.is_reduction and not self.rows_contiguous \
            and len(elements) == 1 and elements[0].along_x and not elements[0].tiles \
            and all(o.domain == ROW_DOMAIN for o in self.outputs if not o.per_element)

    def row_output_domain(self, beside_elements: bool) -> str:
        """The RDom a per-row output walks; `beside_elements`: the kernel also stores per element
        (along r in a row group; along x in a column group, where a row is a column's one value)."""
        return ROW_DOMAIN if beside_elements and self.plan.is_reduction and self.rows_join_elements else "x_dom"

    def row_chunks(self, xnumel: int, rnumel: int, interleave: int, element_size: int) -> RowChunks | None:
        return row_chunks(xnumel, rnumel, interleave, element_size)

    def transposed_output(self, func: str, tiles: TransposeTiles | RowChunks, domain: str) -> None:
        self.outputs.append(_Output(func, domain, True, True, None, False, tiles=tiles))

    def tile_load(self, func: str) -> None:
        """A Func over (r, x) loading an input contiguous along one dim, read by a transposing store
        along the other (TransposeTiles.load_axes)."""
        self.tile_loads.append(func)

    def output(self, func: str, domain: str, per_element: bool, along_x: bool = False) -> None:
        rows = None
        if self.plan.is_reduction:
            # Columns reduce vectorized across x: a task then takes a vector of them per row.
            rows = ROWS_PER_TASK if self.rows_contiguous else ROWS_PER_TASK * VECTOR
        xnumel, rnumel = self.plan.static_sizes()
        extent = rnumel if per_element else xnumel
        wide = extent is not None and (extent % WIDE_VECTOR == 0 or extent >= 16 * WIDE_VECTOR) \
            and self.gathers <= WIDE_GATHERS
        task_rows = ROWS_PER_TASK
        if per_element and xnumel and rnumel:
            # Rows longer than LONG_ROW take fewer than ROWS_PER_TASK a task: Llama's rotary
            # embedding of q ([16, 8192], a cat reading 32 elements either side) ran in 2 tasks of
            # 8 rows, and Halide's loop partitioning left both whole tasks to the clamped loads
            # (gathers) of the buffer's two ends: 49 us warm; a row a task, 13.6 us (2 cores).
            least = min(ROWS_PER_TASK, max(1, LONG_ROW // rnumel))
            task_rows = max(least, min(TASK_ELEMENTS // rnumel, xnumel // MIN_TASKS))
        self.outputs.append(_Output(func, domain, per_element, along_x, rows, self.rows_contiguous,
                                    WIDE_VECTOR if wide else VECTOR, task_rows=task_rows))

    def piece_output(self, func: str, update: int, piece) -> None:
        """Update `update` of output `func`: one piece of its domain (pieces.py), whose RDom's x walks a
        run of contiguous elements and y the runs. Vectorized along a run; tasks take whole runs, or
        parts of the one run there is."""
        stage = f"{func}.update({update}).allow_race_conditions()"
        d, run = piece.domain, piece.inner
        vector = WIDE_VECTOR if run % WIDE_VECTOR == 0 or run >= 16 * WIDE_VECTOR else VECTOR
        vectorized = f".vectorize({d}.x, {vector}, {GUARD})" if run >= VECTOR else ""
        if piece.rows > 1:
            tasks = f".parallel({d}.y, {max(1, ELEMENTS_PER_TASK // run)}, {GUARD})"
        else:
            tasks = f".parallel({d}.x, {vectors_per_task(vector)}, {GUARD})" if vectorized else ""
        self.piece_lines.append(stage + vectorized + tasks)

    def reduction(self, func: str, has_update: bool = True, rvar: str = "rdom.x") -> None:
        self.computed.append((func, not self.rows_contiguous, has_update, rvar))

    def lane_partials(self, func: str, consumer: str) -> None:
        self.entries.append(f"{func}.compute_at({consumer}, x).vectorize(r)")
        self.entries.append(f"{func}.update().vectorize(r)")

    def block_partials(self, lanes: str, block: str, block_var: str, consumer: str, blocks: str) -> None:
        """A long row's lane partials, block by block: each block's lanes are computed and folded
        inside the consumer's walk over the blocks, so they need one block's storage."""
        self.entries.append(f"{block}.compute_at({consumer}, {blocks})")
        self.entries.append(f"{lanes}.compute_at({block}, {block_var}).vectorize(r)")
        self.entries.append(f"{lanes}.update().vectorize(r)")

    def per_column(self, func: str) -> None:
        """A Func over r alone (values the same for every x): computed once per call, before the rest."""
        self.entries.append(f"{func}.compute_root().vectorize(r, {VECTOR}, {GUARD})")

    def row_values(self, func: str) -> None:
        """A value per (r, x) that a reduction and the output both read: stored per task, when the
        task holds every reader; otherwise left inline (computed by each)."""
        self.stored_rows.append(func)

    def scan(self, func: str) -> None:
        self.scans.append(func)

    def blocked_scan(self, stages: list[str], blocks: str) -> None:
        """halide_scan's blocked form: the in-block prefixes stored a row at a time, vectorized
        along it, and the blocks' totals walked serially (a few per row)."""
        self.blocked.append((stages, blocks))

    def staged(self, func: str, per_element: bool) -> None:
        if per_element:
            self.entries.append(f"{func}.compute_root().vectorize(r, {VECTOR}, {GUARD}).parallel(x, {ROWS_PER_TASK}, {GUARD})")
        else:
            self.entries.append(f"{func}.compute_root().vectorize(x, {self.x_lanes}, {GUARD})"
                                f".parallel(x, {vectors_per_task(self.x_lanes)}, {GUARD})")

    def scatter(self, func: str) -> None:
        self.scatters += 1  # serial: two positions may be the same element

    def _placement(self, func: str, across: bool, has_update: bool, vector: str | None = None,
                   rvar: str = "rdom.x", lanes: int = 1) -> list[str]:
        """`lanes`: how many x a given `vector` schedule puts in one vector."""
        # A scan's rows run side by side: the task's rows, together; what it reads (a softmax's
        # sums before a cummax) is then computed for the task's rows too.
        whole_task = vector is not None or bool(self.scans)
        if vector is None:
            lanes = self.x_lanes
            vector, lanes = (f".vectorize(x, {lanes}, {GUARD})", lanes) if across else ("", 1)
        out = self._loop_nest()
        if out is not None:
            where, then = f".compute_at({out.func}, {out.loop(whole_task)}){vector}", vector
            if across and not whole_task and has_update:
                return [f"{func}{where}"] + self._columns_by_row(func, rvar)
        else:
            # x counts vectors once vectorized: a task of ROWS_PER_TASK rows is that many over the lanes.
            parallel = f".parallel(x, {max(1, ROWS_PER_TASK // lanes)}, {GUARD})"
            where, then = f".compute_root(){vector}{parallel}", f"{vector}{parallel}"
        return [f"{func}{where}"] + ([f"{func}.update(){then}"] if has_update and then else [])

    def _columns_by_row(self, func: str, rvar: str) -> list[str]:
        """A column reduction's update over a task's columns: one row at a time, its vectors of
        columns unrolled, so each row is read once, in whole cache lines, into accumulators held
        in registers. (Column by column, a task walked down its rows once per vector, each pass
        refetching lines L1 had dropped: 4096x1024 sum's first kernel, one thread, best of 100 runs
        1.09 -> 0.60 ms.)"""
        outer, inner = f"{func}_vectors", f"{func}_lanes"
        return [f'{outer}, {inner} = hl.Var("{outer}"), hl.Var("{inner}")',
                f"{func}.update().split(x, {outer}, {inner}, {self.x_lanes}, {GUARD}).reorder({inner}, {outer}, {rvar})"
                f".vectorize({inner}).unroll({outer})"]

    def lines(self) -> list[str]:
        lines = list(self.entries) + self.piece_lines
        leader = self._leader() if self.row_group() or self.column_group() else None
        # Outputs first, a row group's leader before the rest: the others, and placements below,
        # name the loop variables it declares.
        for out in sorted(self.outputs, key=lambda o: o is not leader):
            out.x_lanes = self.x_lanes
            out.fused_into = leader if leader is not None and out is not leader else None
            lines += out.lines()
        for func, across, has_update, rvar in self.computed:
            lines += self._placement(func, across, has_update, rvar=rvar)
        for func in self.scans:
            # A scan is a chain of dependent steps along r: its rows run side by side, a vector
            # across x, stored with x innermost so each step's vector is contiguous (2048x2048
            # cumsum, one thread: 6.3 ms one row at a time, 4.6 ms eight rows side by side).
            lines += [f"{func}.reorder_storage(x, r)"]
            lines += self._placement(func, True, True, f".vectorize(x, {SCAN_ROWS}, {GUARD})", lanes=SCAN_ROWS)
        for stages, blocks in self.blocked:
            # Every second stage is stored (the last always): one inline is computed twice by the
            # next from values in L1, cheaper than a pass storing it (2048x2048 cumsum, one
            # thread: all stored 3.02 ms, every second 2.80 ms).
            stored = stages[len(stages) - 1:0:-2][::-1]
            out = self.outputs[0] if len(self.outputs) == 1 and not self.scatters else None
            if out is not None and out.per_element and not out.along_x:
                at = f".compute_at({out.func}, {out.func}_row)"
                lines += [f"{stage}{at}.vectorize(r, {VECTOR}, {GUARD})" for stage in stored]
                lines += [f"{blocks}{at}"]
            else:
                rows = f".parallel(x, {ROWS_PER_TASK}, {GUARD})"
                lines += [f"{stage}.compute_root().vectorize(r, {VECTOR}, {GUARD}){rows}" for stage in stored]
                lines += [f"{blocks}.compute_root(){rows}", f"{blocks}.update(){rows}"]
        for func in self.tile_loads:
            # Loaded a row of the tile per vector, read a column per vector: Halide turns the
            # register tile into shuffles.
            out = self.outputs[0]
            walks, strides = out.tiles.load_axes()
            lines += [f"{func}.compute_at({out.func}, {out.loop()}).store_in(hl.MemoryType.Register)"
                      f".vectorize({walks}).unroll({strides})"]
        out = self._loop_nest()
        if out is not None:
            # As wide as the output's store loop: a softmax's exps, 2048 a row, one thread:
            # 16 lanes 2.65 ms, 64 lanes 2.48 ms.
            lines += [f"{func}.compute_at({out.func}, {out.loop(bool(self.scans))}).vectorize(r, {out.vector}, {GUARD})"
                      for func in self.stored_rows]
        return lines
