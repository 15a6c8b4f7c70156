"""Writes generated sources to the cache folder and imports them, once per process per source."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import types

import triton

_modules: dict[str, types.ModuleType] = {}


def source_path(cache_dir: str, name: str, source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = os.path.join(cache_dir, "sources", digest[:2])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}_{digest}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: another process may be writing the same file
    return path


@contextlib.contextmanager
def interpreter_mode(enabled: bool):
    """While a CPU kernel module is imported, @triton.jit makes interpreted functions."""
    if not enabled:
        yield
        return
    knobs = triton.knobs.runtime
    before = knobs.interpret
    knobs.interpret = True
    try:
        yield
    finally:
        knobs.interpret = before


def load_module(path: str, interpret: bool = False) -> types.ModuleType:
    key = f"{path}:{interpret}"
    if key in _modules:
        return _modules[key]
    name = "smelt_generated_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Triton reads a kernel's source back through its module: it must be importable by name.
    sys.modules[name] = module
    with interpreter_mode(interpret):
        spec.loader.exec_module(module)
    _modules[key] = module
    return module
