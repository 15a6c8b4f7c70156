"""RandomSeeds: the seeds a graph's random ops draw their Philox streams from.

Each call of a compiled graph draws fresh int64 seeds, one per random op, from torch's default
generator for the device (an ATen randint run by the wrapper). So `torch.manual_seed(s)` before a
call fixes every random value the call makes, and consecutive calls differ. Kernels load their
op's seed and turn (seed, element offset) into a value; they never touch generator state.
"""
from __future__ import annotations

import torch

from ..symbolic import sympify
from .extern import ExternKernel
from .nodes import FixedLayout

# Seeds are drawn from [0, 2**63 - 1): any int64 the generator gives is a valid Philox key.
_SEED_HIGH = 2 ** 63 - 1


class RandomSeeds(ExternKernel):
    """int64[count] seeds; `reserve()` hands each random op the position of its own seed."""

    def __init__(self, name: str, device: torch.device, origins: frozenset):
        super().__init__(name, None, torch.ops.aten.randint.low, (), {}, origins, is_fallback=False)
        self.device = device
        self.count = 0
        self._resize()

    def reserve(self) -> int:
        self.count += 1
        self._resize()
        return self.count - 1

    def _resize(self) -> None:
        self.layout = FixedLayout(self.device, torch.int64, (sympify(self.count),), (sympify(1),))
        self.args = (0, _SEED_HIGH, [self.count])
        self.kwargs = {"dtype": torch.int64, "device": self.device}

    def describe(self) -> str:
        return f"{self.name}: random seeds int64[{self.count}] drawn from the default generator of {self.device}"
