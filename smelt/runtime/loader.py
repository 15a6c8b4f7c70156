"""Writes generated sources to the cache folder and imports them, once per process per source."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Callable

import triton

from . import interpreter_compat
from .checked_files import atomic_write

log = logging.getLogger("smelt.runtime")

_modules: dict[str, types.ModuleType] = {}


def source_path(cache_dir: str, name: str, source: str) -> str:
    """The file holding `source` (Triton imports kernels from files). One already there is reused
    when it holds exactly `source`: a damaged one would import as other code, or not at all."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, "sources", digest[:2], f"{name}_{digest}.py")
    data = source.encode()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
        log.warning("smelt: cached source %s is damaged: writing it again", path)
    except FileNotFoundError:
        pass
    atomic_write(path, data)  # another process may be writing the same file
    return path


@contextlib.contextmanager
def interpreter_mode(enabled: bool):
    """While a kernel module is imported, @triton.jit makes interpreted functions (a CPU kernel's)
    or compiled ones (a GPU kernel's), whatever Triton's process-wide knob said before."""
    if enabled:
        interpreter_compat.install()
    knobs = triton.knobs.runtime
    before = knobs.interpret
    knobs.interpret = enabled
    try:
        yield
    finally:
        knobs.interpret = before


# Imports take turns: the interpreter knob is process-wide, and a GPU kernel's first launch imports
# it (DeferredKernel) on whichever thread launches, maybe while a CPU kernel is imported on another.
_import_lock = threading.RLock()


def load_module(path: str, interpret: bool = False) -> types.ModuleType:
    key = f"{path}:{interpret}"
    with _import_lock:
        if key in _modules:
            return _modules[key]
        name = "smelt_generated_" + os.path.basename(path)[:-3]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        # Triton reads a kernel's source back through its module: it must be importable by name.
        sys.modules[name] = module
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
        # Run from its source, not through the import system, which would keep and trust a
        # __pycache__ file next to it: a damaged one fails the import.
        with interpreter_mode(interpret):
            exec(code, module.__dict__)
        _modules[key] = module
        return module


class DeferredKernel:
    """A generated kernel's @triton.jit function, imported from its source file at first use. A GPU
    kernel launched from a kept binary never needs it: building a JITFunction parses the kernel's
    source (about a millisecond a kernel; 323 kernels, 0.31 s of ViT's warm training start under
    cProfile on the H200). `failed` turns an import error into the error to raise."""

    def __init__(self, path: str, name: str, failed: Callable[[Exception], Exception]):
        self.path, self.name, self._failed = path, name, failed
        self._fn = None

    def get(self):
        if self._fn is None:
            try:
                self._fn = getattr(load_module(self.path), self.name)
            except Exception as e:
                raise self._failed(e) from e
        return self._fn


def resolved(fn):
    """The JITFunction `fn` stands for (a DeferredKernel is imported now)."""
    return fn.get() if isinstance(fn, DeferredKernel) else fn
