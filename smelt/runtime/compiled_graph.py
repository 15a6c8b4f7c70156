"""The callable AOTAutograd gets back for one graph: the generated wrapper, and what went into it."""
from __future__ import annotations

import dataclasses


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

    def __post_init__(self):
        # AOTAutograd passes the argument list itself, which the wrapper clears to free inputs
        # early. An instance attribute, so that wrappers made with functools.wraps keep it.
        self._boxed_call = True

    def __call__(self, *args):
        # Some AOTAutograd paths (a lazily compiled backward) call unboxed; graph inputs are
        # tensors and numbers, never lists, so a single list argument is the boxed form.
        if len(args) == 1 and isinstance(args[0], list):
            return self.call(args[0])
        return self.call(list(args))
