"""Pieces every code generator uses: an indented text buffer, CSE, kernel argument lists."""
from __future__ import annotations

import contextlib
import dataclasses

import torch


class IndentedBuffer:
    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def writeline(self, line: str = "") -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    def splice(self, other: "IndentedBuffer") -> None:
        """Append other's lines as they are: a nested buffer is made at the level it will sit at."""
        self.lines.extend(other.lines)

    @contextlib.contextmanager
    def indent(self, by: int = 1):
        self.level += by
        try:
            yield
        finally:
            self.level -= by

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclasses.dataclass(frozen=True)
class CSEVar:
    """A named value in generated code, with its torch dtype and how far it is broadcast.

    `rank` is 0 for a scalar, 1 for a value per x, 2 for a value per (x, r).
    """

    name: str
    dtype: torch.dtype
    rank: int

    def __str__(self):
        return self.name


class CSE:
    """Names each distinct expression once. Scopes nest: a loop body sees the values made before it,
    and what it makes is forgotten when it ends (it is not computed outside the loop)."""

    def __init__(self, prefix: str = "tmp"):
        self.prefix = prefix
        self.counter = 0
        self.scopes: list[dict[str, CSEVar]] = [{}]

    def lookup(self, expr: str) -> CSEVar | None:
        for scope in reversed(self.scopes):
            if expr in scope:
                return scope[expr]
        return None

    def generate(self, out: IndentedBuffer, expr: str, dtype: torch.dtype, rank: int) -> CSEVar:
        found = self.lookup(expr)
        if found is not None:
            return found
        var = CSEVar(f"{self.prefix}{self.counter}", dtype, rank)
        self.counter += 1
        out.writeline(f"{var.name} = {expr}")
        self.scopes[-1][expr] = var
        return var

    def remember(self, key: str, var: CSEVar) -> None:
        self.scopes[-1][key] = var

    def redirect(self, var: CSEVar, replacement: CSEVar) -> None:
        """Later requests for var's expression get replacement (the same value, kept elsewhere)."""
        for scope in self.scopes:
            for key, found in scope.items():
                if found is var:
                    scope[key] = replacement

    @contextlib.contextmanager
    def scope(self):
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()


class KernelArgs:
    """Pointer arguments of a kernel, named in_ptrN / out_ptrN, and the buffers they stand for."""

    def __init__(self):
        self.inputs: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.sizes: list[str] = []
        self._made = {"in_ptr": 0, "out_ptr": 0}  # names are never reused, even after a move

    def _new(self, prefix: str) -> str:
        name = f"{prefix}{self._made[prefix]}"
        self._made[prefix] += 1
        return name

    def input(self, buffer: str) -> str:
        if buffer in self.outputs:
            return self.outputs[buffer]
        if buffer not in self.inputs:
            self.inputs[buffer] = self._new("in_ptr")
        return self.inputs[buffer]

    def output(self, buffer: str) -> str:
        if buffer in self.inputs:
            # Read and written by the same kernel (an input mutation): one pointer does both.
            ptr = self.inputs.pop(buffer)
            self.outputs[buffer] = ptr
            return ptr
        if buffer not in self.outputs:
            self.outputs[buffer] = self._new("out_ptr")
        return self.outputs[buffer]

    def size(self, name: str) -> str:
        if name not in self.sizes:
            self.sizes.append(name)
        return name

    def call_order(self) -> list[tuple[str, str]]:
        """(parameter name, buffer name) in the order the kernel declares them."""
        return [(ptr, buffer) for buffer, ptr in list(self.inputs.items()) + list(self.outputs.items())]


# Ops whose result on half-float operands is itself a value of that half float, so there is no
# rounding for eager to do after them.
HALF_EXACT_OPS = frozenset({"neg", "abs", "maximum", "minimum", "floor", "ceil", "trunc", "round", "sign",
                            "copysign", "fmax", "fmin", "relu"})


def computed(var: CSEVar, op: str) -> CSEVar:
    """`var`, the result of `op`, typed as what its register holds.

    Half floats are computed in float32, and eager rounds every op's result to the half float. The
    IR says where (a to_dtype after each op), but a to_dtype to the type a value already has is
    dropped: a product of two bfloat16 values typed bfloat16 kept all its float32 digits, and a
    comparison with the rounded copy stored by another kernel failed (amin's backward: x * 1.5 ==
    amin(x * 1.5) was False, a 0/0 gradient). Typed float32, the next to_dtype rounds it."""
    if var.dtype in (torch.float16, torch.bfloat16) and op not in HALF_EXACT_OPS:
        return CSEVar(var.name, torch.float32, var.rank)
    return var


def register_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value has in registers, in every backend: half floats are computed in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def scan_register_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a scanned value is in registers: half floats as float32, bool as int8 (whose order
    and arithmetic are plain integers')."""
    return torch.int8 if dtype == torch.bool else register_dtype(dtype)
