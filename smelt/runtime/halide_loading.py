"""How a Halide kernel's GeneratedKernel becomes what the wrapper calls: its pipeline compiled
ahead of time (or found in the cache folder) and called through ctypes."""
from __future__ import annotations

from ..artifact import GeneratedKernel
from .compile_pool import compile_ahead
from .halide_cuda_launcher import halide_launcher


def load(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    return halide_launcher(kernel.name, kernel.source, list(kernel.origins), cache_dir, path)


def build_ahead(kernels: list[GeneratedKernel], paths: dict[str, str], cache_dir: str, workers: int,
                keep_kernels: bool) -> None:
    """The CPU kernels not yet in the cache, compiled `workers` at a time (compile_pool.py); Halide's
    libraries always live in the cache, whatever `keep_kernels` says of GPU binaries."""
    cpu = [(k.name, k.source, paths[k.name]) for k in kernels if "\nDEVICE = 'cpu'" in k.source]
    compile_ahead(cpu, cache_dir, workers)
