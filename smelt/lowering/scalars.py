"""`.item()` and runtime checks on the sizes it yields (Dynamo's capture_scalar_outputs)."""
from __future__ import annotations

import sympy
import torch

from ..ir.scalars import AssertScalar, DynamicScalar
from ..symbolic import sympify
from .registry import lowering

aten = torch.ops.aten


@lowering(aten._local_scalar_dense)
def local_scalar_dense(g, x):
    symbol = sympify(g.out_meta)
    if not isinstance(symbol, sympy.Symbol):
        raise NotImplementedError(f"smelt: .item() whose value is already known as {symbol}")
    g.register_buffer(DynamicScalar(g.new_name(), g.realize(x), symbol, g.origin))
    return symbol


@lowering(aten._assert_scalar)
def assert_scalar(g, condition, message):
    condition = sympy.sympify(condition)
    if condition is sympy.true:
        return None
    if condition is sympy.false:
        raise AssertionError(f"smelt: {message} (always fails)")
    g.register_buffer(AssertScalar(g.new_name(), condition, message, g.origin))
    return None


@lowering(aten.sym_constrain_range_for_size, aten.sym_constrain_range)
def constrain_range(g, symbol, min=None, max=None):
    # Facts for the shape environment at trace time; the checks themselves arrive as _assert_scalar.
    return None
