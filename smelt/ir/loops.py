"""Loop nests: Pointwise and Reduction, each a define-by-run `inner_fn` over an index space."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..symbolic import Expr, index_var, product
from .nodes import IRNode
from .ops import TextHandler, use_handler

# Reduction kinds, each with how many values it yields. welford_reduce yields (mean, m2, count)
# in one pass; online_softmax_reduce yields (max, sum of exp(value - max)) in one pass;
# argmax/argmin yield the index of the first extreme value, as eager does.
# welford_combine merges partial (mean, m2, count) triples: its inner_fn returns such a triple.
REDUCTION_OUTPUTS = {
    "sum": 1, "prod": 1, "max": 1, "min": 1, "any": 1, "all": 1,
    "argmax": 1, "argmin": 1, "welford_reduce": 3, "welford_combine": 3, "online_softmax_reduce": 2,
}


def reduction_identity(reduction_type: str, dtype: torch.dtype):
    """The value that leaves a reduction unchanged: what a masked-off element contributes."""
    if reduction_type in ("sum", "any", "welford_reduce", "welford_combine"):
        return 0
    if reduction_type in ("prod", "all"):
        return 1
    low = reduction_type in ("max", "argmax")
    if dtype.is_floating_point:
        return float("-inf") if low else float("inf")
    if dtype == torch.bool:
        return 0 if low else 1
    info = torch.iinfo(dtype)
    return info.min if low else info.max


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
        if reduction_type not in REDUCTION_OUTPUTS:
            raise ValueError(f"smelt: unknown reduction type {reduction_type!r}")
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
        which = f"[{self.output_index}]" if REDUCTION_OUTPUTS[self.reduction_type] > 1 else ""
        return (f"Reduction[{', '.join(map(str, self.ranges))} | {', '.join(map(str, self.reduction_ranges))}]"
                f"({self.reduction_type}{which}: {self.body_text()})")
