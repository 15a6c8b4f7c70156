"""Steps of the wrapper that work on Python scalars rather than tensors.

`x.item()` (with Dynamo's capture_scalar_outputs) gives an unbacked size symbol such as u0 that
later shapes and bodies use; DynamicScalar binds it at run time. `torch._check` on such symbols
gives AssertScalar, a check the wrapper runs before anything depends on it.
"""
from __future__ import annotations

import sympy

from .nodes import Buffer


class DynamicScalar(Buffer):
    """`symbol = source.item()`: the one element of a tensor, as a Python number."""

    binds_name = False  # the wrapper binds the symbol itself, which later sizes use

    def __init__(self, name: str, source, symbol: sympy.Symbol, origins: frozenset):
        super().__init__(name, None)
        self.source = source
        self.symbol = symbol
        self.origins = origins

    def inputs(self) -> list:
        return [self.source]

    def describe(self) -> str:
        return f"{self.name}: {self.symbol} = {self.source.name}.item()"


class AssertScalar(Buffer):
    """Raises `message` at run time unless `condition` (a sympy relation over sizes) holds."""

    has_side_effects = True  # nothing reads it, and it must still run
    binds_name = False  # the wrapper prints a statement, not an assignment to free later

    def __init__(self, name: str, condition: sympy.Basic, message: str, origins: frozenset):
        super().__init__(name, None)
        self.condition = condition
        self.message = message
        self.origins = origins

    def inputs(self) -> list:
        return []

    def describe(self) -> str:
        return f"{self.name}: assert {self.condition}"
