"""Modules that the first compile of a process imports anyway, imported with smelt instead.

Each is imported lazily by torch, Triton or sympy the first time a compile reaches a certain
point; imported here, they leave the first compile and join `import smelt`, where the rest of
torch's and Triton's import cost already is. An import that fails (a build without
torch.distributed, say) is skipped: the compile then does without it as before.
"""
from __future__ import annotations

import importlib

MODULES = (
    # sympy's Add imports its tensor algebra the first time it adds terms (smelt's index math).
    "sympy.tensor.tensor",
    # Triton's argument specialization imports Gluon at the first kernel launch.
    "triton.experimental.gluon",
    # Dynamo imports DTensor's context-parallel hooks the first time it traces a torch function.
    "torch.distributed.tensor.experimental",
)


def import_lazy_dependencies() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part of a library may be missing or broken
            pass
