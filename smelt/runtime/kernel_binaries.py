"""The compiled variants of one GPU kernel source: in memory, kept on disk, or compiled now.

A variant is selected by what its code was specialized on (cuda_binary.describe: dtypes, 16-byte
alignment, integer widths and divisibility), the block constants and the number of warps. Kept
variants live under `cache_dir/kernels/<key>`, keyed by all of that plus the kernel's source,
smelt's source, Triton's version and installation, and the device's compute capability, so a
later process launches them without compiling or even importing Triton's compiler.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading

import torch

from ..source_digest import smelt_source_digest
from .cuda_binary import CudaBinary, CudaError, compile_binary, describe
from .loader import resolved
from .triton_cubin import compile_options


@functools.lru_cache(maxsize=None)
def _triton_installation() -> str:
    """Stands in for Triton's hash of itself (its sources and shared library, about a third of a
    second): version, place, and the shared library's size and date."""
    import triton
    root = os.path.dirname(triton.__file__)
    libs = sorted(f for f in os.listdir(os.path.join(root, "_C")) if f.startswith("libtriton"))
    stats = [(f, os.stat(os.path.join(root, "_C", f)).st_size, os.stat(os.path.join(root, "_C", f)).st_mtime_ns)
             for f in libs]
    return json.dumps([triton.__version__, root, stats])


def _jit_environment() -> str:
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    return json.dumps([_triton_installation(), sorted(get_cache_invalidating_env_vars().items()),
                       bool(triton.knobs.runtime.debug)])


def variant_key(source: str, spec: tuple, constexprs: dict, num_warps: int, capability) -> str:
    # smelt's own source stands for the helpers a kernel imports from smelt.
    text = json.dumps([_jit_environment(), smelt_source_digest(), hashlib.sha256(source.encode()).hexdigest(),
                       spec, sorted(constexprs.items()), num_warps, list(capability)])
    return hashlib.sha256(text.encode()).hexdigest()


# Where the latest assembled graph keeps its binaries (None: not kept): smelt's own ops that launch
# hand-written kernels (short_attention.py) keep theirs there too.
_kept_in: str | None = None


def keep_binaries_in(cache_dir: str | None) -> None:
    global _kept_in
    _kept_in = cache_dir


def kept_in() -> str | None:
    return _kept_in


def folder_for(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, "kernels", key[:2], key)


# ------------------------------------------------------------------ Triton's self-hash, off the critical path

_self_hash: threading.Thread | None = None


def prepare_compiler() -> None:
    """Start Triton's hash of its own installation in the background. The first kernel compile
    of a process waits for it; started when a graph on the GPU begins compiling, it runs while
    AOTAutograd, lowering and code generation do. (sha256 and file reads release the GIL.)"""
    global _self_hash
    if _self_hash is None:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # a Triton that keeps it elsewhere: the compile computes it itself
            return
        _self_hash = threading.Thread(target=triton_key, name="smelt-triton-key", daemon=True)
        _self_hash.start()


def _compiler_ready() -> None:
    if _self_hash is not None:
        _self_hash.join()


class Unsupported(Exception):
    """Arguments or a kernel this path does not launch: Triton's JIT takes over."""


class KernelVariants:
    """One kernel's compiled variants (fn is its JITFunction or a loader.DeferredKernel, source its text)."""

    def __init__(self, fn, source: str, cache_dir: str | None):
        self.fn = fn
        self.source = source
        self.cache_dir = cache_dir  # None: nothing kept on disk
        self._variants: dict[tuple, CudaBinary] = {}

    def binary(self, args, constexprs: dict, num_warps: int, device: int) -> CudaBinary:
        """The variant for these arguments; raises triton.CompilationError for a kernel that does
        not compile, Unsupported (or CudaError) where the JIT must launch it instead."""
        spec = describe(args)
        if spec is None:
            raise Unsupported("arguments smelt does not describe")
        key = (spec, tuple(constexprs.items()), num_warps, device)
        binary = self._variants.get(key)
        if binary is None:
            binary = self.load_or_compile(spec, constexprs, num_warps, torch.cuda.get_device_capability(device))
            binary.load(device)
            self._variants[key] = binary
        return binary

    def load_or_compile(self, spec, constexprs, num_warps, capability: tuple[int, int]) -> CudaBinary:
        """The binary for one argument description and compute capability, kept or compiled now
        (no GPU needed: runtime/cuda_compile_check.py compiles for sm_90 on the CPU)."""
        folder = None
        if self.cache_dir is not None:
            folder = folder_for(self.cache_dir, variant_key(self.source, spec, constexprs, num_warps, capability))
            kept = CudaBinary.read(folder)
            if kept is not None:
                return kept
        _compiler_ready()
        try:
            binary = compile_binary(resolved(self.fn), spec, constexprs, num_warps, capability,
                                    compile_options(self.source), self.cache_dir)
        except CudaError as e:
            raise Unsupported(str(e)) from e
        if folder is not None:
            binary.save(folder)
        return binary
