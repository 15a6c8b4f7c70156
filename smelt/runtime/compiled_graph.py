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

    # AOTAutograd passes the argument list itself, which the wrapper clears to free inputs early.
    _boxed_call = True

    def __call__(self, args):
        return self.call(args)
