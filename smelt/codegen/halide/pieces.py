"""A pointwise kernel split into one loop per piece of an index coordinate.

A cat read inside a kernel picks each element's input with comparisons of its position along the cat's
dim, and loads every input under a mask: Halide evaluates both sides of a select, so each masked load
is clamped into its buffer, a gather. Halide's loop partitioning finds one stretch of a loop where its
clamps are idle, and a cat's pieces have none in common (a 1-D cat of two pieces over 1M float32: 770
us against Inductor's 420; a KV cache's cat along the sequence, 8 rows of [1024, 128], 650 us against
200 for a loop per piece). Split along the coordinate those comparisons read, each piece's loop knows
which input it reads: the comparisons fold to constants and its loads are plain (kernel.py).

The coordinate is (v // divisor) % modulus of one of the kernel's pure vars v: x in a kernel of one
value per x, r in a pointwise kernel over (r, x) (Llama's rotary embedding: a cat along each row's
head dim). A piece holds the coordinate's values [low, high): in each of the `outer` blocks of
divisor * modulus elements it is one contiguous run of (high - low) * divisor elements. Its loop nest
walks rows of one run each: r an element of the run, x the row (a block, or in a kernel over (r, x) a
block of one of its x). `substitution` says which of the kernel's (x, r) that is, and the piece's
index expressions are rewritten in it: simplified, they are linear along the run (vector loads) with
any division left on x (once a row).
"""
from __future__ import annotations

import dataclasses

import sympy

from ...scheduler.nodes import RINDEX, XINDEX
from ...symbolic import FloorDiv, ModularIndexing

# Off: every kernel keeps one loop (the A/B switch `benchmarks.probes.cpu_pieces` flips).
SPLIT_KERNELS = True
# More pieces than this keep one loop: each piece is a loop nest of its own in the compiled kernel
# (a cat of more than 8 pieces is written slice by slice anyway: lowering/cat_pad.py).
MAX_PIECES = 9
# A kernel whose store transposes in tiles (schedule.TransposeTiles) is printed in pieces, which
# have no tiles, only where it loads this many inputs under masks or more: each tile evaluates every
# masked load for every element, and Halide's compile grows with loads x tile. `python -m
# benchmarks.probes.cpu_pieces`: a dense block's cat of 8 channels-last pieces back to NCHW, first
# call 68.5 -> 4.8 s, 1312 -> 222 us a call; of 2 pieces of 128 channels the tiles ran faster.
MIN_GATHERS_OVER_TILES = 4
# The RDom each piece's stores walk is named this with the piece's number.
PIECE_DOMAIN = "piece_dom"


@dataclasses.dataclass(frozen=True)
class Piece:
    number: int
    low: int  # the coordinate's values [low, high)
    high: int
    divisor: int
    modulus: int
    outer: int  # blocks of divisor * modulus elements along var
    var: sympy.Symbol = XINDEX  # the pure var split: XINDEX or RINDEX
    xnumel: int = 1  # the kernel's extents; rnumel None: a kernel over x alone
    rnumel: int | None = None

    @property
    def run(self) -> int:
        """Contiguous values of var the piece holds in each block."""
        return (self.high - self.low) * self.divisor

    @property
    def inner(self) -> int:
        """The extent of the piece's r: its runs, or the kernel's r where the piece splits x over (r, x)."""
        return self.rnumel if self.rnumel is not None and self.var == XINDEX else self.run

    @property
    def rows(self) -> int:
        """The extent of the piece's x."""
        if self.rnumel is None:
            return self.outer
        return self.outer * (self.xnumel if self.var == RINDEX else self.run)

    @property
    def domain(self) -> str:
        return f"{PIECE_DOMAIN}{self.number}"

    def ranges(self) -> dict:
        return {RINDEX: self.inner, XINDEX: self.rows}

    def substitution(self) -> dict:
        """The kernel's pure vars as expressions of the piece's (r, x)."""
        start, first = self.divisor * self.modulus, self.divisor * self.low
        if self.rnumel is None:  # x: its runs along r, its blocks along x
            return {XINDEX: start * XINDEX + first + RINDEX}
        if self.var == XINDEX:  # x's runs and blocks along x, r as it was
            return {XINDEX: start * FloorDiv(XINDEX, self.run) + first + ModularIndexing(XINDEX, 1, self.run)}
        # r's runs along r, its blocks and the kernel's x along x
        block = ModularIndexing(XINDEX, 1, self.outer) if self.outer > 1 else 0
        return {RINDEX: start * block + first + RINDEX, XINDEX: FloorDiv(XINDEX, self.outer)}


def coordinate(expr: sympy.Expr, numel: int, var: sympy.Symbol = XINDEX) -> tuple[int, int] | None:
    """(divisor, modulus) where expr is (var // divisor) % modulus of the kernel's var in [0, numel)."""
    if expr == var:
        return 1, numel
    if isinstance(expr, FloorDiv) and expr.args[0] == var and expr.args[1].is_Integer:
        a = int(expr.args[1])
        return (a, numel // a) if numel % a == 0 else None
    if isinstance(expr, ModularIndexing) and expr.args[0] == var and all(e.is_Integer for e in expr.args[1:]):
        return int(expr.args[1]), int(expr.args[2])
    return None


def boundaries(op: str, difference: sympy.Expr, numel: int, var: sympy.Symbol = XINDEX):
    """((divisor, modulus), values where `difference op 0` may change) for a comparison whose
    difference of sides is +-coordinate + constant; None for any other comparison."""
    constant, rest = difference.as_coeff_Add()
    sign, term = rest.as_coeff_Mul()
    if not constant.is_Integer or sign not in (1, -1):
        return None
    where = coordinate(term, numel, var)
    if where is None:
        return None
    zero = int(-constant * sign)  # the coordinate's value where the sides are equal
    # A coordinate c: c - t < 0 turns at t, c - t <= 0 at t + 1; t - c < 0 at t + 1, t - c <= 0 at t.
    turns = {"lt": (0,), "ge": (0,), "le": (1,), "gt": (1,), "eq": (0, 1), "ne": (0, 1)}[op]
    if sign == -1:
        turns = tuple(1 - t for t in turns)
    return where, {zero + t for t in turns}


def split(cuts: list[tuple[str, sympy.Expr]], xnumel: int, rnumel: int | None = None) -> list[Piece] | None:
    """The pieces the kernel's comparisons of one coordinate cut it into (rnumel None: a kernel over x
    alone); None where they read more than one coordinate, another kind of expression, or cut nothing."""
    if rnumel is None:
        return _split(cuts, XINDEX, xnumel, xnumel, None)
    return _split(cuts, RINDEX, rnumel, xnumel, rnumel) or _split(cuts, XINDEX, xnumel, xnumel, rnumel)


def _split(cuts, var, numel: int, xnumel: int, rnumel: int | None) -> list[Piece] | None:
    where, points = None, set()
    for op, difference in cuts:
        found = boundaries(op, difference, numel, var)
        if found is None or (where is not None and found[0] != where):
            return None
        where = found[0]
        points |= found[1]
    if where is None:
        return None
    a, b = where
    if b <= 1 or numel % (a * b):
        return None
    edges = sorted({0, b} | {p for p in points if 0 < p < b})
    if not 3 <= len(edges) <= MAX_PIECES + 1:
        return None
    return [Piece(k, low, high, a, b, numel // (a * b), var, xnumel, rnumel)
            for k, (low, high) in enumerate(zip(edges, edges[1:]))]


def decide(op: str, low: int, high: int) -> bool | None:
    """`d op 0` for every d in [low, high], where that is one answer; else None."""
    always, never = {
        "lt": (high < 0, low >= 0), "le": (high <= 0, low > 0), "gt": (low > 0, high <= 0),
        "ge": (low >= 0, high < 0), "eq": (low == high == 0, high < 0 or low > 0),
        "ne": (high < 0 or low > 0, low == high == 0)}[op]
    return True if always else (False if never else None)
