"""Every reduction kind smelt lowers, as one record each: what it yields and how its partial results
combine. Lowering, the split and row-split strategies and the printers ask this table rather than
keeping their own lists of names."""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class ReductionKind:
    name: str
    outputs: int  # values it yields per row
    # What a masked-off element contributes: "zero", "one", "lowest" or "highest" (of the dtype).
    identity: str
    # Its partials over chunks of a row are reduced again by the same kind (a split's second stage
    # is this kind too); argmax and welford need a stage of their own (lowering/two_stage_reduction.py).
    same_kind_stages: bool = False
    # A split (two kernels over chunks of each row) has a second stage for it.
    splits: bool = False
    # Programs sharing one row can combine their float32 partials after a barrier (row split).
    row_combinable: bool = False


KINDS = {k.name: k for k in (
    ReductionKind("sum", 1, "zero", same_kind_stages=True, splits=True, row_combinable=True),
    ReductionKind("prod", 1, "one", same_kind_stages=True, splits=True),
    ReductionKind("max", 1, "lowest", same_kind_stages=True, splits=True, row_combinable=True),
    ReductionKind("min", 1, "highest", same_kind_stages=True, splits=True, row_combinable=True),
    ReductionKind("any", 1, "zero", same_kind_stages=True, splits=True),
    ReductionKind("all", 1, "one", same_kind_stages=True, splits=True),
    # the index of the first extreme value, as eager's
    ReductionKind("argmax", 1, "lowest", splits=True),
    ReductionKind("argmin", 1, "highest", splits=True),
    # (mean, m2, count) in one pass
    ReductionKind("welford_reduce", 3, "zero", splits=True),
    # merges partial (mean, m2, count) triples: its inner_fn returns such a triple
    ReductionKind("welford_combine", 3, "zero"),
    # (max, sum of exp(value - max)) in one pass
    ReductionKind("online_softmax_reduce", 2, "lowest", row_combinable=True),
)}


def kind(name: str) -> ReductionKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"smelt: unknown reduction kind {name!r} (known: {', '.join(KINDS)})") from None


def reduction_identity(name: str, dtype: torch.dtype):
    """The value that leaves a reduction unchanged: what a masked-off element contributes."""
    identity = kind(name).identity
    if identity in ("zero", "one"):
        return 0 if identity == "zero" else 1
    low = identity == "lowest"
    if dtype.is_floating_point:
        return float("-inf") if low else float("inf")
    if dtype == torch.bool:
        return 0 if low else 1
    info = torch.iinfo(dtype)
    return info.min if low else info.max
