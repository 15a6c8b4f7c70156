"""Calls into ATen: extern kernels (mm, conv, ...) and fallbacks for ops smelt does not lower.

Their arguments are kept as the original Python structure with IR inputs in place; the wrapper
prints each input as a buffer name or a strided view of one.
"""
from __future__ import annotations

from typing import Any

from .nodes import Buffer, Layout


def returns_new_memory(op) -> bool:
    """Whether ATen op `op` returns memory of its own: its schema lets no result alias an argument
    (not a view, not an in-place or out= op) and it writes none of them."""
    schema = getattr(op, "_schema", None)
    return schema is not None and not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def returns_fresh_buffer(buffer) -> bool:
    """Whether an ATen call's result (or one of several) is memory of its own: a convolution's
    output, not a view."""
    return returns_new_memory(getattr(buffer, "op", None) or getattr(getattr(buffer, "parent", None), "op", None))


class ExternKernel(Buffer):
    """`name = op(*args, **kwargs)` run by ATen. `layout` is None when the op returns several tensors."""

    def __init__(self, name: str, layout: Layout | None, op, args: tuple, kwargs: dict,
                 origins: frozenset, is_fallback: bool):
        super().__init__(name, layout)
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.origins = origins
        self.is_fallback = is_fallback
        self.has_side_effects = False  # kept even when nothing reads it

    def inputs(self) -> list:
        """The IR inputs among the arguments, in order."""
        found = []

        def visit(a):
            if isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)
            elif hasattr(a, "get_size") and hasattr(a, "name"):
                found.append(a)

        visit(self.args)
        visit(tuple(self.kwargs.values()))
        return found

    def describe(self) -> str:
        kind = "fallback" if self.is_fallback else "extern"
        layout = self.layout if self.layout is not None else "(several outputs)"
        return f"{self.name}: {kind} {self.op} -> {layout}"


class MultiOutput(Buffer):
    """One tensor of a multi-output extern call, found at `path` (indices into nested tuples)."""

    def __init__(self, name: str, layout: Layout, parent: ExternKernel, path: tuple[int, ...]):
        super().__init__(name, layout)
        self.parent = parent
        self.path = path
        self.origins = parent.origins

    def describe(self) -> str:
        return f"{self.name}: {self.parent.name}{''.join(f'[{i}]' for i in self.path)} {self.layout}"


def walk_args(value: Any, fn):
    """Rebuild a nested args structure with fn applied to every leaf."""
    if isinstance(value, (list, tuple)):
        return type(value)(walk_args(v, fn) for v in value)
    return fn(value)
