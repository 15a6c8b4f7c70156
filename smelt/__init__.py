"""smelt: a PyTorch compiler. `torch.compile(model, backend="smelt")` after `import smelt`."""
from __future__ import annotations

import torch

from . import config, errors, observe
from .backend import smelt_backend
from .preload import freeze_import_time_objects, import_lazy_dependencies, skip_guard_latency_profile

import_lazy_dependencies()
skip_guard_latency_profile()

__all__ = ["compile", "config", "errors", "observe", "smelt_backend"]


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "smelt" not in _BACKENDS or _BACKENDS.get("smelt") is None:
        register_backend(name="smelt", compiler_fn=smelt_backend)


_register()
freeze_import_time_objects()


def compile(fn=None, **options):
    """`torch.compile(fn, backend="smelt", **options)`."""
    return torch.compile(fn, backend="smelt", **options)
