"""Two-dimensional tiles for pointwise kernels whose reads and writes walk memory in different orders.

A 1-D pointwise kernel gives each program a run of consecutive output elements. When one access
is contiguous along the output's last dimension and another along an earlier one (a transpose, a
permute, a channels-last copy), one of them strides through memory and half the traffic is
uncoalesced. A tiled kernel splits the flat index into (outer, inner) at a dimension boundary,
index = x * inner + r, and gives each program an [XBLOCK, RBLOCK] tile of that 2-D space: the
access contiguous along r reads rows of the tile, the one contiguous along x reads its columns,
and Triton moves values between the two layouts through shared memory.

Such a kernel reuses the x/r axes of reduction kernels (every member is placed "xr"), except
that r is split across programs rather than looped over. The decision is made from the index
expressions alone: tile when some split makes more accesses contiguous (or broadcast) along one
of the two axes than the 1-D walk does. A target whose per-element arithmetic costs time (a CPU:
`Target.rows_for_row_values`) also splits where some loads then depend on the row alone, such as a
channel's statistics over an NCHW tensor, so that they are computed once per row.
"""
from __future__ import annotations

import dataclasses
import functools

import sympy

from ..ir.ops import is_indirect
from ..symbolic import FloorDiv, ModularIndexing, product, static_int
from .fusion import FusedGroup, dependencies_line_up
from .nodes import RINDEX, SchedulerNode, XINDEX, same
from .placement import Placement

@dataclasses.dataclass(frozen=True)
class Tiling:
    """A pointwise kernel over outer * inner elements, walked as x in [0, outer), r in [0, inner)."""

    outer: sympy.Expr
    inner: sympy.Expr
    along_x: tuple[str, ...]  # buffers read or written contiguously along x (the tile's columns)
    along_r: tuple[str, ...]  # ... along r (the tile's rows)
    # Chosen so that values of the row alone or the column alone are computed once per tile row or
    # column (`_rows_for_row_values`), not to make a transpose's accesses contiguous.
    row_values: bool = False

    def describe(self) -> str:
        return (f"# tiled: {self.outer} (x) x {self.inner} (r), each program one XBLOCK x RBLOCK tile; "
                f"contiguous along x: {', '.join(self.along_x) or '-'}; along r: {', '.join(self.along_r) or '-'}")


# Lanes reading one element this many at a time and then jumping read a few elements per memory
# transaction (32 bytes: 8 float32 elements): a gather.
MIN_RUN = 8


def stride_along(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """How far expr moves in memory when var grows by one, within a run of consecutive var values;
    None when that is not a fixed amount (a var inside a sum in a division, an indirect index).

    A term `k * (var // d)` holds still for d steps, then jumps by k. Beside a term that walks
    every step (var itself, or var % m) it only cuts the walk into runs of d, which the tile's
    other axis may fill (rows of 3 channels interleaved: `768 * (x // 3) + x % 3`, the planes of a
    transposed copy: `2100 * (x // 30) + x % 30`). Alone, it moves k / d a step on average where
    k <= d (a channel index `(x // HW) % C`: nearly a broadcast; nearest upsampling's `w // 2`), and
    with k > d it jumps every d lanes: a gather when d < MIN_RUN (a stride-2 window's input gradient
    reads `144 * (w // 2)`), not a broadcast."""
    if isinstance(expr, sympy.Add):  # a constant term moves nothing: a window's taps share one answer
        expr = expr.as_coeff_Add()[1]
    return _stride_along(expr, var)


@functools.lru_cache(maxsize=8192)
def _stride_along(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    walking = sympy.Integer(0)  # from terms that move every step
    steps = []  # (k, d) of the terms that move every d steps
    for term in sympy.Add.make_args(sympy.expand(expr)):
        if var not in term.free_symbols:
            continue
        factors = sympy.Mul.make_args(term)
        moving = [f for f in factors if var in f.free_symbols]
        if len(moving) != 1:
            return None
        (f,) = moving
        coeff = sympy.Mul(*[g for g in factors if g is not f])
        if f == var or (isinstance(f, ModularIndexing) and f.args[0] == var and f.args[1] == 1):
            walking += coeff  # var % m wraps every m steps, onto elements the run has read
        elif isinstance(f, (FloorDiv, ModularIndexing)) and f.args[0] == var:
            steps.append((coeff, f.args[1]))
        else:
            return None
    if walking != 0 or not steps:
        return walking
    stride = sympy.Integer(0)
    for k, d in steps:
        average = k / d
        if average.is_number and abs(average) <= 1:
            stride += average  # each element read by d / k lanes in turn
        elif _shorter_than_a_run(d):
            return None
    return stride


def _shorter_than_a_run(length: sympy.Expr) -> bool:
    n = static_int(length)
    return n is not None and n < MIN_RUN


def _is_cheap(expr: sympy.Expr, axes: tuple[sympy.Symbol, ...]) -> bool:
    """Whether an access costs whole memory transactions per block: it is contiguous along one
    of the block's axes, or does not move along one of them (a broadcast, read once per tile)."""
    if any(is_indirect(s) for s in expr.free_symbols):
        return True  # a gather costs the same however the block is shaped: it does not decide
    strides = [stride_along(expr, v) for v in axes]
    # A run of lanes reads one run of memory: stride 1 or 0, or a fraction (each element read by
    # several lanes in turn, either way).
    return any(s is not None and s.is_number and (s == 1 or abs(s) < 1) for s in strides)


def _accesses(nodes: list[SchedulerNode], stored: list[str], placement: Placement, xnumel, rnumel):
    """(buffer, index) of every load from memory and every store of the group, each once."""
    written_before: set[str] = set()
    found: dict = {}  # an ordered set
    for node in nodes:
        for name, index in node.reads_in_kernel(placement, xnumel, rnumel):
            if name not in written_before:  # values made by an earlier member come from registers
                found[(name, index)] = None
        if node.write_name in stored:
            found[(node.write_name, node.store_index(placement, xnumel, rnumel))] = None
        written_before.add(node.write_name)
    return list(found)


def _score(accesses, axes) -> int:
    return sum(_is_cheap(index, axes) for _, index in accesses)


def _inner_sizes(nodes: list[SchedulerNode], flat_accesses, numel) -> list[sympy.Expr]:
    """Where a tile may split: the element count of each trailing run of some member's dims, and
    each run length the 1-D accesses divide the flat index by (a member that iterates a flat
    range may still read a transposed view)."""
    found: list[sympy.Expr] = []
    for node in nodes:
        ranges = [r for r in node.data.ranges if r != 1]
        found += [product(ranges[k:]) for k in range(1, len(ranges))]
        found += node.memory_order_splits()
    for _, index in flat_accesses:
        for f in index.atoms(FloorDiv, ModularIndexing):
            if f.args[0] == XINDEX:
                found += [f.args[1]] + ([f.args[1] * f.args[2]] if isinstance(f, ModularIndexing) else [])
    sizes: list[sympy.Expr] = []
    for inner in found:
        divides = sympy.fraction(sympy.cancel(numel / inner))[1] == 1
        if inner != 1 and divides and not same(inner, numel) and not any(same(inner, s) for s in sizes):
            sizes.append(inner)
    return sizes


def choose_tiling(group: FusedGroup, stored: list[str], target=None) -> Tiling | None:
    """The best (outer, inner) split of a pointwise group, or None when the 1-D walk is as good.
    `target` (smelt/target.py) may also ask for rows where a value depends on the row alone."""
    if group.is_reduction or group.is_extern or any(n.is_scatter for n in group.nodes):
        return None
    numel = group.xnumel
    if static_int(numel) is not None and static_int(numel) <= 1:
        return None
    flat = _accesses(group.nodes, stored, Placement.X, numel, 1)
    flat_score = _score(flat, (XINDEX,))
    if flat_score == len(flat):
        if target is None or not target.rows_for_row_values:
            return None
        return _rows_for_row_values(group, stored, flat, numel, target.row_value_tile_width)
    best, best_key = None, None
    for inner in _inner_sizes(group.nodes, flat, numel):
        outer = sympy.cancel(numel / inner)
        if not _places_every_member(group, outer, inner):
            continue
        accesses = _accesses(group.nodes, stored, Placement.XR, outer, inner)
        score = _score(accesses, (XINDEX, RINDEX))
        # Prefer more cheap accesses, then the squarer split (fuller tiles).
        o, i = static_int(outer), static_int(inner)
        key = (score, min(o, i) if o is not None and i is not None else 0)
        if score > flat_score and (best_key is None or key > best_key):
            best_key = key
            best = Tiling(outer, inner, *_contiguous_buffers(accesses))
    return best


# Rows shorter than this are not worth walking as rows: a few vector steps each.
MIN_ROW = 64
# Except rows whose values per position are the same for every row (an NHWC batch norm's rows of
# C = 16 channels): a vector per row, its per-channel values computed once per call by the backend,
# where the flat walk gathered them at index % C and took a sqrt per element.
MIN_COLUMN_ROW = 16


def _rows_for_row_values(group: FusedGroup, stored: list[str], flat, numel, tile_width: int | None) -> Tiling | None:
    """Rows (outer x inner) over which some loads depend on the row alone or on the position in
    the row alone, every other access walking the row contiguously. BatchNorm's per-channel
    statistics over an NCHW activation are then loaded, and their rsqrt computed, once per row of
    H*W elements instead of per element; over an NHWC activation (rows of C) they are read as one
    contiguous vector per row, where the flat walk gathered them at index % C. The split with most
    such loads, then the longest rows. `tile_width` (Target.row_value_tile_width): rows must be
    covered by whole tiles of at most that width."""
    if all(stride_along(index, XINDEX) == 1 and _affine_in(index, XINDEX) for _, index in flat):
        return None  # every access walks the flat index itself: split anywhere, each walks its rows
    best, best_key = None, None
    for inner in _inner_sizes(group.nodes, flat, numel):
        rows = static_int(inner)
        if rows is None or rows < MIN_COLUMN_ROW:
            continue
        if tile_width is not None and not _whole_tiles(rows, tile_width):
            continue
        outer = sympy.cancel(numel / inner)
        if not _places_every_member(group, outer, inner):
            continue
        accesses = _accesses(group.nodes, stored, Placement.XR, outer, inner)
        per_row = columns = 0
        for _, index in accesses:
            if any(is_indirect(s) for s in index.free_symbols):
                per_row = -1
                break
            along_r = stride_along(index, RINDEX)
            if along_r == 0 and XINDEX in index.free_symbols:
                per_row += 1
            elif along_r == 1 and XINDEX not in index.free_symbols and _affine_in(index, RINDEX):
                per_row += 1  # the same row of values for every row: one vector load, no index % C
                columns += 1
            elif along_r != 1:
                per_row = -1  # an access that strides along the row: the 1-D walk reads it better
                break
        if rows < MIN_ROW and not columns:
            continue
        key = (per_row, rows)
        if per_row > 0 and (best_key is None or key > best_key):
            best_key = key
            best = Tiling(outer, inner, *_contiguous_buffers(accesses), row_values=True)
    return best


def _places_every_member(group: FusedGroup, outer, inner) -> bool:
    """Whether every member walks the (outer, inner) tile and still reads each value an earlier
    member makes at the point it was made. A member that iterates its flat range in memory order
    (a transposed copy) may be split by its own dims instead: the 1-D walk lined up, the tile not
    (a bf16 copy of v^T fused with v's float32 copy read v^T's values transposed, Halide, CPU)."""
    return (all(n.placement(outer, inner) == Placement.XR for n in group.nodes)
            and dependencies_line_up(group.nodes, outer, inner))


def _whole_tiles(rows: int, width: int) -> bool:
    """Whether rows of this length are covered by tiles of a power-of-two width up to `width` with
    nothing masked: a power of two below it, or a multiple of it."""
    return rows % width == 0 or (rows < width and rows & (rows - 1) == 0)


def _affine_in(index: sympy.Expr, var: sympy.Symbol) -> bool:
    """No // or % of `var` in index: it walks one run, without wrapping around."""
    return not any(var in f.free_symbols for f in index.atoms(FloorDiv, ModularIndexing))


def _contiguous_buffers(accesses) -> tuple[tuple[str, ...], tuple[str, ...]]:
    along_x, along_r = [], []
    for name, index in accesses:
        if stride_along(index, RINDEX) == 1:
            along_r.append(name)
        elif stride_along(index, XINDEX) == 1:
            along_x.append(name)
    return tuple(dict.fromkeys(along_x)), tuple(dict.fromkeys(along_r))
