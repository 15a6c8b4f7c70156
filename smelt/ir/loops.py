"""Loop nests: Pointwise and Reduction, each a define-by-run `inner_fn` over an index space."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..symbolic import Expr, index_var, product
from .nodes import IRNode
from .ops import TextHandler, use_handler
from .reduction_kinds import kind

class Loops(IRNode):
    reduction_ranges: tuple = ()  # a Reduction's own; other loop nests reduce over nothing

    def __init__(self, device: torch.device, dtype: torch.dtype, inner_fn: Callable,
                 ranges: Sequence[Expr], origins: frozenset = frozenset()):
        self.device = device
        self.dtype = dtype
        self.inner_fn = inner_fn
        self.ranges = list(ranges)
        self.origins = frozenset(origins)

    def get_size(self):
        return list(self.ranges)

    def get_dtype(self):
        return self.dtype

    def get_device(self):
        return self.device

    def index_vars(self, prefix="i"):
        return [index_var(f"{prefix}{k}") for k in range(len(self.ranges))]


class Pointwise(Loops):
    """out[index] = inner_fn(index)."""

    def make_loader(self):
        return self.inner_fn

    def body_text(self) -> str:
        with use_handler(TextHandler()) as handler:
            return handler.render(self.inner_fn(self.index_vars()))

    def __str__(self):
        return f"Pointwise[{', '.join(map(str, self.ranges))}]({self.body_text()})"


class Reduction(Loops):
    """out[index] = reduce over rindex of inner_fn(index, rindex).

    `ranges` is the output's shape; `reduction_ranges` the shape reduced over. `output_index`
    picks one value of a reduction that yields several (welford_reduce); nodes that share
    (inner_fn, ranges, type) are computed once in a kernel.
    """

    def __init__(self, device, dtype, inner_fn, ranges, reduction_ranges, reduction_type,
                 src_dtype, output_index: int = 0, origins=frozenset()):
        super().__init__(device, dtype, inner_fn, ranges, origins)
        kind(reduction_type)  # an unknown kind raises, naming the known ones
        self.reduction_ranges = list(reduction_ranges)
        self.reduction_type = reduction_type
        self.src_dtype = src_dtype
        self.output_index = output_index

    def make_loader(self):
        raise AssertionError("a Reduction is realized before anything loads from it")

    def reduction_numel(self):
        return product(self.reduction_ranges)

    def reduction_vars(self):
        return [index_var(f"r{k}") for k in range(len(self.reduction_ranges))]

    def body_text(self) -> str:
        with use_handler(TextHandler()) as handler:
            value = self.inner_fn(self.index_vars(), self.reduction_vars())
            return handler.render(f"({', '.join(map(str, value))})" if isinstance(value, tuple) else value)

    def __str__(self):
        which = f"[{self.output_index}]" if kind(self.reduction_type).outputs > 1 else ""
        return (f"Reduction[{', '.join(map(str, self.ranges))} | {', '.join(map(str, self.reduction_ranges))}]"
                f"({self.reduction_type}{which}: {self.body_text()})")
