"""How a Halide kernel's GeneratedKernel becomes what the wrapper calls: its pipeline compiled
ahead of time (or found in the cache folder) and called through ctypes."""
from __future__ import annotations

from ..artifact import GeneratedKernel
from .halide_cuda_launcher import halide_launcher


def load(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    return halide_launcher(kernel.name, kernel.source, list(kernel.origins), cache_dir, path)
