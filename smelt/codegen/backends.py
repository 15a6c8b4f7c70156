"""The code generators a kernel can be printed with, by name, and what the pipeline asks of one.

A backend package (codegen/triton/, codegen/halide/, ...) defines one Backend, named in the table
of smelt/backend_registry.py. The pipeline and the runtime ask this registry; no code outside a
backend's package names one to decide what to do.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol

import torch

from ..backend_registry import BACKENDS as PACKAGES
from ..errors import SmeltError

if TYPE_CHECKING:
    from ..artifact import GeneratedKernel
    from ..target import Target
    from ..ir.graph import IRGraph
    from ..scheduler.schedule import Step


class KernelUnsupported(SmeltError, NotImplementedError):
    """A backend cannot print a kernel (an op, dtype or kernel kind); the message names it. The
    pipeline prints that kernel with the device's fallback backend instead."""


@dataclasses.dataclass
class GraphContext:
    """What every kernel of one graph is printed against. `memo`: per-graph state a backend keeps
    (Triton's combo bodies); `refused`: kernels a backend's own compiler rejected before, by name;
    `plain`: kernels it rejected once, printed again in a plainer form (Halide: no per-column Funcs)."""
    graph: "IRGraph"
    cfg: Any
    steps: list
    refused: frozenset = frozenset()
    plain: frozenset = frozenset()
    memo: dict = dataclasses.field(default_factory=dict)

    def remember(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


class Backend(Protocol):
    name: str
    devices: frozenset[str]  # device types it prints kernels for

    def interprets(self, device_type: str) -> bool:
        """Whether its kernels for this device run through an interpreter (slow; for testing)."""

    def target(self, device_type: str) -> "Target":
        """What the lowering is told of the machine its kernels for this device run on."""

    def finishes_reductions(self, step: "Step", ctx: GraphContext) -> bool:
        """Whether the step's kernel can run small reductions of its results in its last program
        (scheduler/finishers.py pairs them)."""

    def launch_key(self, step: "Step", ctx: GraphContext) -> Hashable | None:
        """Steps with one equal key share a launch (scheduler/combo.py); None: alone."""

    def alike(self, step: "Step", ctx: GraphContext) -> bool:
        """Whether other steps of the graph could share a launch with this one."""

    def generate(self, step: "Step", ctx: GraphContext, index: int) -> Any:
        """The kernel's printed source (what the wrapper launches); KernelUnsupported if it has none."""

    def record(self, kernel: Any, step: "Step", ctx: GraphContext, index: int) -> "GeneratedKernel":
        """What the runtime loads for the printed kernel."""


FALLBACK = "triton"  # prints every kernel smelt lowers, on every device it runs on


def names() -> tuple[str, ...]:
    return tuple(sorted(PACKAGES))


def named(name: str) -> Backend:
    if name not in PACKAGES:
        raise SmeltError(f"smelt: no backend named {name!r} (known: {', '.join(names())})")
    return importlib.import_module(PACKAGES[name].codegen).BACKEND


def for_device(cfg, device: torch.device) -> Backend:
    """The backend the settings choose for tensors on `device`."""
    backend = named(cfg.backend_for(device.type))
    if device.type not in backend.devices:
        raise SmeltError(f"smelt: backend {backend.name!r} for {device.type} tensors does not exist "
                         f"(set SMELT_{device.type.upper()}_BACKEND={FALLBACK})")
    return backend


def fallback() -> Backend:
    return named(FALLBACK)


def step_device(step: "Step") -> torch.device:
    return step.group.nodes[0].buffer.get_device()
