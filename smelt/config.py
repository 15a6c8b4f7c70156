"""One settings object for smelt, each field overridable by an SMELT_* environment variable.

Environment variables are read when `Config()` is built, and `current()` builds a fresh one per
compiled graph, so a test or a user may change them between compiles.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import os
import shutil
import tempfile

log = logging.getLogger("smelt")


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


@functools.lru_cache(maxsize=None)
def default_cpu_backend() -> str:
    """Halide, where it can run: its package is installed and a C compiler links its kernels.
    Otherwise the Triton interpreter, which is slow but needs neither (said once, in the log)."""
    missing = [what for what, found in (("the halide package", importlib.util.find_spec("halide")),
                                        ("a C compiler `cc`", shutil.which("cc"))) if not found]
    if not missing:
        return "halide"
    log.warning("smelt: CPU graphs run through Triton's interpreter (slow): Halide needs %s. "
                "Set SMELT_CPU_BACKEND to choose.", " and ".join(missing))
    return "triton"


@dataclasses.dataclass(frozen=True)
class Config:
    # Which code generator runs graphs whose tensors live on the CPU: compiled Halide pipelines, or
    # (`triton`) Triton kernels run by its interpreter, which is slow and there to test Triton codegen.
    cpu_backend: str = dataclasses.field(default_factory=lambda: os.environ.get("SMELT_CPU_BACKEND")
                                         or default_cpu_backend())
    cuda_backend: str = dataclasses.field(default_factory=lambda: _env("SMELT_CUDA_BACKEND", "triton"))
    # When set, every compiled graph dumps its stages into its own subfolder here.
    debug_dir: str | None = dataclasses.field(default_factory=lambda: os.environ.get("SMELT_DEBUG_DIR") or None)
    # Where generated kernel and wrapper sources are written so Triton can read them back.
    cache_dir: str = dataclasses.field(
        default_factory=lambda: _env("SMELT_CACHE_DIR", os.path.join(tempfile.gettempdir(), "smelt_cache"))
    )
    # Compiled graphs are kept under cache_dir and reused by later processes (SMELT_GRAPH_CACHE=0: never).
    graph_cache: bool = dataclasses.field(default_factory=lambda: _env("SMELT_GRAPH_CACHE", "1") != "0")
    # Reductions whose rows are at most this long keep the whole row in registers.
    persistent_reduction_limit: int = dataclasses.field(
        default_factory=lambda: int(_env("SMELT_PERSISTENT_REDUCTION_LIMIT", "4096"))
    )
    # Reductions with few outputs over many elements run in two kernels: partial results over
    # chunks of each row, then a reduction of the partials (lowering/split_reduction.py).
    split_reductions: bool = dataclasses.field(
        default_factory=lambda: _env("SMELT_SPLIT_REDUCTIONS", "1") not in ("0", "false", "False", "")
    )
    # Only reductions whose every program would read at least this many elements are split (a
    # row's length, or a column block's rows times columns); tests lower it to split small tensors.
    split_reduction_min_numel: int = dataclasses.field(
        default_factory=lambda: int(_env("SMELT_SPLIT_REDUCTION_MIN_NUMEL", "32768"))
    )
    # Scans (cumsum, cummax, ...) whose rows are at most this long scan the whole row in registers;
    # longer rows are scanned block by block, carrying the running value.
    persistent_scan_limit: int = dataclasses.field(
        default_factory=lambda: int(_env("SMELT_PERSISTENT_SCAN_LIMIT", "4096"))
    )

    # Cache hints on the loads of reduction kernels (codegen/eviction.py); SMELT_EVICTION_HINTS=0: none.
    eviction_hints: bool = dataclasses.field(default_factory=lambda: _env("SMELT_EVICTION_HINTS", "1") != "0")

    # A linear layer's GELU (tanh) or ReLU applied by cuBLASLt's epilogue on CUDA half floats
    # (lowering/gemm_epilogue.py); SMELT_GEMM_EPILOGUES=0: a pointwise kernel applies it.
    gemm_epilogues: bool = dataclasses.field(default_factory=lambda: _env("SMELT_GEMM_EPILOGUES", "1") != "0")

    # Time a few block configurations of each kernel on its first launch and keep the fastest
    # (cached on disk under cache_dir/autotune). Off: the block heuristic alone decides.
    autotune: bool = dataclasses.field(default_factory=lambda: _env("SMELT_AUTOTUNE", "0") == "1")

    def backend_for(self, device_type: str) -> str:
        if device_type == "cpu":
            return self.cpu_backend
        if device_type == "cuda":
            return self.cuda_backend
        raise ValueError(f"smelt: no code generator for device type {device_type!r}")


def current() -> Config:
    return Config()
