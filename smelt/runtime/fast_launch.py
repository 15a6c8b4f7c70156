"""Kernel launches in one call from Python into C (launch_ext.c), instead of ctypes marshalling
each argument: the launcher of a resolved launch cost 7.3 us on the H200 host through ctypes, and a
Halide CPU kernel's buffer descriptions about 3 us a tensor in Python.

The extension is built once per machine with the system C compiler into the cache folder (written
whole, its hash beside it: checked_files), and calls cuLaunchKernel at the address ctypes finds in
libcuda, so it needs Python's headers but no CUDA ones. Where it cannot be built (no `cc`, no
headers) launches go through ctypes, after one line in the log.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig

from ..errors import KernelCompileError

log = logging.getLogger("smelt.runtime")

SOURCE = os.path.join(os.path.dirname(__file__), "launch_ext.c")
MODULE = "smelt_launch_ext"


def library_path(cache_dir: str) -> str:
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(source + sys.version.encode() + (sysconfig.get_config_var("EXT_SUFFIX") or "").encode())
    return os.path.join(cache_dir, "launcher", f"{MODULE}_{key.hexdigest()[:16]}.so")


def build(cache_dir: str) -> str:
    """The extension's path, built first where it is not in the cache intact."""
    from .halide_compile import build_named_checked, run_cc  # the same locked, checked build as Halide's libraries

    path = library_path(cache_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise KernelCompileError(f"smelt: no Python.h under {include} (Python's development headers)")
    build_named_checked(path, lambda tmp: run_cc(["-O2", "-shared", "-fPIC", f"-I{include}", "-o",
                                                  os.path.join(tmp, "out"), SOURCE],
                                                 f"compiling {SOURCE}", "SMELT_CUDA_BACKEND"))
    return path


def load_module(path: str):
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def extension(cache_dir: str):
    """The built extension module; None where it cannot be built."""
    try:
        return load_module(build(cache_dir))
    except (KernelCompileError, OSError, ImportError) as e:
        log.info("smelt: kernels launch through ctypes: the C launcher could not be built (%s)", e)
        return None


@functools.lru_cache(maxsize=None)
def launcher(cache_dir: str, launch_kernel_address: int):
    """The extension's `launch`, set to call cuLaunchKernel at that address; None where it cannot be built."""
    module = extension(cache_dir)
    if module is None:
        return None
    module.set_driver(launch_kernel_address)
    return module.launch


def halide_runner(cache_dir: str):
    """The extension's `halide_run` (Halide's CPU kernels); None where it cannot be built."""
    module = extension(cache_dir)
    return None if module is None else module.halide_run
