"""Scan: an inclusive prefix combine along one dimension (cumsum, cumprod, cummax, logcumsumexp, ...).

A scan carries a tuple of values per element (cummax carries the value and its index) and folds
them with an associative `combine(earlier, later) -> combined`, written against the `ops`
vocabulary like any loop body. Code generators print the combine as a function of their
language; the built-in combines are registered by name so that a generator may use a native
form (Triton's own sum combine, which its interpreter runs with numpy).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from ..symbolic import Expr, product
from .loops import Loops
from .ops import TextHandler, ops, use_handler


@dataclasses.dataclass(frozen=True)
class ScanCombine:
    """An associative function over tuples of `num_values` values: fn(earlier, later) -> tuple.

    Only associativity is assumed, not commutativity: `earlier` always holds the elements
    before `later`'s.
    """

    name: str
    num_values: int
    fn: Callable[[tuple, tuple], tuple]


class Scan(Loops):
    """out[index] = combine over j <= index[dim] of inner_fn(index with index[dim] = j).

    `inner_fn(index)` returns a tuple of `combine.num_values` values with dtypes `dtypes`; this
    node is the buffer of value number `output_index`. Nodes that share (inner_fn, ranges,
    combine) are computed once in a kernel, as multi-output reductions are.
    """

    def __init__(self, device: torch.device, dtypes: Sequence[torch.dtype], inner_fn: Callable,
                 ranges: Sequence[Expr], dim: int, combine: ScanCombine, output_index: int = 0,
                 origins: frozenset = frozenset()):
        super().__init__(device, dtypes[output_index], inner_fn, ranges, origins)
        if not 0 <= dim < len(self.ranges):
            raise ValueError(f"smelt: scan dim {dim} out of range for shape {self.ranges}")
        if len(dtypes) != combine.num_values:
            raise ValueError(f"smelt: scan {combine.name} combines {combine.num_values} values, got dtypes {dtypes}")
        self.dtypes = tuple(dtypes)
        self.dim = dim
        self.combine = combine
        self.output_index = output_index

    def make_loader(self):
        raise AssertionError("a Scan is realized before anything loads from it")

    def outer_ranges(self) -> list[Expr]:
        """The dimensions that are not scanned: one independent scan per index of these."""
        return self.ranges[:self.dim] + self.ranges[self.dim + 1:]

    def scan_numel(self) -> Expr:
        return self.ranges[self.dim]

    def outer_numel(self) -> Expr:
        return product(self.outer_ranges())

    def body_text(self) -> str:
        with use_handler(TextHandler()):
            return ", ".join(map(str, self.inner_fn(self.index_vars())))

    def __str__(self):
        which = f"[{self.output_index}]" if self.combine.num_values > 1 else ""
        return (f"Scan[{', '.join(map(str, self.ranges))} along dim {self.dim}]"
                f"({self.combine.name}{which}: {self.body_text()})")


# ---------------------------------------------------------------- the built-in combines

def _add(a, b):
    return (ops.add(a[0], b[0]),)


def _mul(a, b):
    return (ops.mul(a[0], b[0]),)


def _extreme_with_index(later_wins: str, with_nan: bool):
    """(value, index) pairs: the extreme value, the LAST index among ties, and NaN above all, as
    eager's cummax/cummin (which update whenever the new element is >= / <= or NaN). The index
    comparison, not argument order, decides ties, so the combine is also commutative."""
    def fn(a, b):
        value_a, index_a = a
        value_b, index_b = b
        beats = getattr(ops, later_wins)(value_b, value_a)
        ties = ops.eq(value_b, value_a)
        if with_nan:
            nan_a, nan_b = ops.isnan(value_a), ops.isnan(value_b)
            beats = ops.logical_or(beats, ops.logical_and(nan_b, ops.logical_not(nan_a)))
            ties = ops.logical_or(ties, ops.logical_and(nan_a, nan_b))
        take_b = ops.logical_or(beats, ops.logical_and(ties, ops.gt(index_b, index_a)))
        return ops.where(take_b, value_b, value_a), ops.where(take_b, index_b, index_a)
    return fn


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) without overflow; equal infinities give themselves, NaN spreads."""
    x, y = a[0], b[0]
    high, low = ops.maximum(x, y), ops.minimum(x, y)
    finite = ops.logical_not(ops.isinf(low))
    mixed = ops.logical_or(ops.ne(high, low), finite)  # NaN != NaN, so NaN takes this branch
    return (ops.where(mixed, ops.add(high, ops.log1p(ops.exp(ops.sub(low, high)))), x),)


SCAN_COMBINES: dict[str, ScanCombine] = {c.name: c for c in [
    ScanCombine("sum", 1, _add),
    ScanCombine("prod", 1, _mul),
    ScanCombine("max_with_index", 2, _extreme_with_index("gt", with_nan=True)),
    ScanCombine("min_with_index", 2, _extreme_with_index("lt", with_nan=True)),
    ScanCombine("int_max_with_index", 2, _extreme_with_index("gt", with_nan=False)),
    ScanCombine("int_min_with_index", 2, _extreme_with_index("lt", with_nan=False)),
    ScanCombine("logaddexp", 1, _log_add_exp),
]}
