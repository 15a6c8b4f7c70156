"""The ops vocabulary applied to torch tensors, as eager computes each op.

Values are tensors broadcastable to the kernel's [X, R] block, held in the dtype every backend
holds them in registers: half floats as float32, rounded where the IR converts (to_dtype), on
loads and on stores. Binary ops promote both sides with torch.promote_types first, as the printed
backends do (torch's own rule would let a 0-d constant lose to a block's dtype).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy
import torch

from ...ir.ops import BINARY_OPS, UNARY_OPS, indirect_symbol
from ..common import register_dtype
from .index import evaluate

if TYPE_CHECKING:
    from .kernel import KernelRun

_LOGICAL = ("logical_and", "logical_or", "logical_xor")
_INT_DIVISIONS = ("floordiv", "remainder", "fmod")
_BINARY = {
    "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift,
}


def _binary_fn(name: str):
    return _BINARY.get(name) or getattr(torch, name)


class ReferenceOps:
    def __init__(self, run: KernelRun):
        self.run = run

    def load(self, name, index):
        return self.run.load(name, index)

    def constant(self, value, dtype):
        if isinstance(value, sympy.Basic):
            value = evaluate(value, self.run.env, self.run.device).item()
        device = self.run.device
        if dtype.is_floating_point:  # a half float's literal keeps its digits, as opmath does in eager
            return torch.tensor(value, dtype=register_dtype(dtype), device=device)
        if dtype == torch.bool:
            return torch.tensor(bool(value), device=device)
        return torch.tensor(int(value), dtype=torch.int64, device=device).to(dtype)  # wraps, as eager

    def index_expr(self, expr, dtype):
        return evaluate(expr, self.run.env, self.run.device).to(register_dtype(dtype))

    def to_dtype(self, x, dtype):
        return x.to(dtype).to(register_dtype(dtype))

    def where(self, cond, a, b):
        dtype = torch.promote_types(a.dtype, b.dtype)
        return torch.where(cond.to(torch.bool), a.to(dtype), b.to(dtype))

    def masked(self, mask, body, other):
        mask = mask.to(torch.bool)
        self.run.mask_stack.append(mask)
        try:
            value = body()
        finally:
            self.run.mask_stack.pop()
        return torch.where(mask, value, torch.tensor(other, device=value.device).to(value.dtype))

    def indirect_indexing(self, value, size):
        size = evaluate(size, self.run.env, self.run.device)
        index = value.to(torch.int64)
        index = torch.where(index < 0, index + size, index)  # negative counts from the end, as in eager
        self.run.check_bounds(index, size, "an indirect index")
        symbol = indirect_symbol(len(self.run.indirect))
        self.run.indirect.append(symbol)
        self.run.env[str(symbol)] = index
        return symbol

    def __getattr__(self, name):
        if name in UNARY_OPS:
            return lambda x: torch.logical_not(x) if name == "logical_not" else getattr(torch, name)(x)
        if name in BINARY_OPS:
            return lambda a, b: self._binary(name, a, b)
        raise AttributeError(name)

    def _binary(self, name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if name in _LOGICAL:
            return getattr(torch, name)(a.to(torch.bool), b.to(torch.bool))
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
        if name in _INT_DIVISIONS and not dtype.is_floating_point:
            # A lane dividing by zero raises in torch; in a kernel it is a lane nobody keeps (eager
            # itself raises before any kernel runs such a division).
            b = torch.where(b == 0, torch.ones_like(b), b)
        return _binary_fn(name)(a, b)
