"""The check behind every ATen call of a compiled graph: its result has the strides the graph was
planned with.

The kernels after an ATen call index its result with the strides the traced graph gave it. smelt
hands ATen its inputs in their traced layouts, so the two agree; should an op still return another
layout (a kernel choice that depends on more than its inputs' strides), its result is copied into
the planned one, once logged, rather than read with the wrong strides.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("smelt.runtime")
_reported: set[str] = set()


def as_planned(t: torch.Tensor, size: tuple, stride: tuple, op: str) -> torch.Tensor:
    actual = t.stride()
    if actual == stride or all(n == 1 or a == b for n, a, b in zip(size, actual, stride)):
        return t
    if op not in _reported:
        _reported.add(op)
        log.warning("smelt: %s returned strides %s where the compiled graph planned %s; its result is copied "
                    "into the planned layout (correct, but slower: please report it)", op, actual, stride)
    planned = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    return planned.copy_(t)
