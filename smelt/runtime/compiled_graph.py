"""The callable AOTAutograd gets back for one graph: the generated wrapper, and what went into it."""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class CompiledGraph:
    kind: str  # "inference" | "forward" | "backward"
    call: object
    kernel_names: list[str]
    kernel_sources: dict[str, str]
    kernel_paths: dict[str, str]
    fallback_ops: list[str]
    wrapper_source: str
    wrapper_path: str
    cache_key: str | None = None  # its graph cache entry, if it has one
    stage_seconds: dict = dataclasses.field(default_factory=dict)  # smelt/compile_stages.py
    # The most bytes of the wrapper's own buffers alive at once (codegen/wrapper.py); None if symbolic.
    planned_peak_bytes: int | None = None
    # A forward's saved values it returns as their padded rows (lowering/layout_plan.py).
    padded_saved: dict = dataclasses.field(default_factory=dict)
    # With SMELT_FREEZE_WEIGHTS: the prologue computing values from weights alone (lowering/frozen_weights.py).
    folded_weights: object = None
    # A backward's arguments it writes over, given as copies when autograd keeps the graph
    # (retain_graph, create_graph): set where smelt, not AOTAutograd, guards its donated buffers
    # (backend._take_over_donation).
    copied_when_kept: tuple = ()
    # The wrapper module's globals: its kernels' launchers and the facts it states (codegen/wrapper.py graph_facts).
    namespace: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        # AOTAutograd passes the argument list itself, which the wrapper clears to free inputs
        # early. An instance attribute, so that wrappers made with functools.wraps keep it.
        self._boxed_call = True

    def __call__(self, *args):
        # Some AOTAutograd paths (a lazily compiled backward) call unboxed; graph inputs are
        # tensors and numbers, never lists, so a single list argument is the boxed form.
        args = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        if self.copied_when_kept and torch._C._autograd._get_current_graph_task_keep_graph():
            for i in self.copied_when_kept:  # a later backward over the kept graph reads them again
                args[i] = separate_copy(args[i])
        return self.call(args)


def separate_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` over a copy of its whole storage: a backward reading a saved value as padded rows reads
    past the view's own elements."""
    copy = torch.empty(0, dtype=t.dtype, device=t.device)
    return copy.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
