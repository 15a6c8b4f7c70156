"""The one registry of lowerings: ATen op -> function building IR.

A lowering is `fn(graph, *args, **kwargs)`: tensor arguments arrive as TensorBoxes, SymInts as
sympy expressions, everything else as it was in the FX graph. It returns a TensorBox, or a tuple
of them when the op returns several tensors.
"""
from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict = {}


def _overloads(op):
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def lowering(*ops) -> Callable:
    def register(fn):
        for op in ops:
            for overload in _overloads(op):
                LOWERINGS[overload] = fn
        return fn
    return register


def lookup(target):
    return LOWERINGS.get(target)
