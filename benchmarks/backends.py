"""How each backend under test turns a function into the callable we time."""
from __future__ import annotations

from typing import Any, Callable

import torch

BACKENDS = ("eager", "inductor", "smelt")


def _smelt_backend() -> Any:
    import smelt  # noqa: F401  (importing is what registers the backend name)

    if "smelt" in torch._dynamo.list_backends(exclude_tags=()):
        return "smelt"
    # Without `pip install -e .` the entry point in pyproject.toml is not registered, so hand
    # dynamo the backend callable itself.
    from smelt.backend import smelt_backend

    return smelt_backend


def compile_fn(backend: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The callable for `backend`; compiles lazily, so the first call pays the compile."""
    if backend == "eager":
        return fn
    # Each backend gets a clean dynamo cache so one backend's guards never serve the other's call.
    torch._dynamo.reset()
    if backend == "inductor":
        return torch.compile(fn)
    if backend == "smelt":
        return torch.compile(fn, backend=_smelt_backend())
    if backend == "dynamo":
        # Dynamo's capture with nothing compiled: the floor under any backend's compile time.
        return torch.compile(fn, backend="eager")
    raise ValueError(f"unknown backend {backend!r}")


def preload(backend: str) -> None:
    """Import what `backend` needs up front, so compile timings leave out Python import time."""
    if backend == "inductor":
        import torch._inductor.compile_fx  # noqa: F401
    elif backend == "smelt":
        _smelt_backend()
