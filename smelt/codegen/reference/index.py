"""Index expressions evaluated on tensors: the kernel's xindex and rindex are aranges shaped to
broadcast ([X, 1] and [1, R]), sizes are ints, indirect indices are loaded int64 tensors."""
from __future__ import annotations

import functools
import math

import sympy
import torch

from ...symbolic import pexpr


def _fold(tensor_op, python_op):
    def apply(*args):
        if any(isinstance(a, torch.Tensor) for a in args):
            return functools.reduce(lambda a, b: tensor_op(torch.as_tensor(a), torch.as_tensor(b)), args)
        return python_op(*args)
    return apply


def _rounding(tensor_op, python_op):
    return lambda v: tensor_op(v) if isinstance(v, torch.Tensor) else python_op(v)


# What pexpr's text calls: Python's // and % floor, as index math (kept non-negative) needs.
NAMESPACE = {"math": math, "min": _fold(torch.minimum, min), "max": _fold(torch.maximum, max),
             "Mod": lambda a, b: a % b, "floor": _rounding(torch.floor, math.floor),
             "ceiling": _rounding(torch.ceil, math.ceil)}


@functools.lru_cache(maxsize=8192)
def _compiled(expr: sympy.Expr):
    return compile(pexpr(expr), "<smelt index>", "eval")


def evaluate(expr, env: dict, device) -> torch.Tensor:
    """expr's value as an int64 tensor (0-d where it depends on no index tensor)."""
    expr = sympy.sympify(expr)
    value = int(expr) if expr.is_Integer else eval(_compiled(expr), NAMESPACE, env)
    return torch.as_tensor(value, device=device).to(torch.int64)


def free_names(expr) -> set[str]:
    return {str(s) for s in sympy.sympify(expr).free_symbols}
