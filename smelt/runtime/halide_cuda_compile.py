"""Compiles Halide pipelines scheduled for the GPU (SMELT_CUDA_BACKEND=halide) ahead of time.

As on the CPU (halide_compile.py), a kernel's object holds no runtime and is linked into a small
shared library against one shared runtime, here Halide's runtime with its CUDA module, plus
halide_cuda_shim.c, which makes Halide use torch's context and stream. The kernel's device code
is PTX inside that object, which the driver compiles for the GPU when the kernel first loads.

Halide 21 names CUDA capabilities up to 8.6; a newer GPU (the H100's 9.0) runs PTX for 8.6.
Nothing here needs a GPU: a CPU-only machine compiles and links these libraries as well.
"""
from __future__ import annotations

import functools
import os

from ..errors import KernelCompileError
from .halide_compile import _folder, _key, _link, build_named_checked, run_cc
from .halide_compile import kernel_library as host_kernel_library

RUNTIME_NAME = "libsmelt_halide_cuda_runtime"
SHIM = os.path.join(os.path.dirname(__file__), "halide_cuda_shim.c")
# Halide's CUDA capability features, newest first: (capability, feature name).
CAPABILITIES = ((86, "CUDACapability86"), (80, "CUDACapability80"), (75, "CUDACapability75"),
                (70, "CUDACapability70"), (61, "CUDACapability61"), (50, "CUDACapability50"))


def capability_feature(capability: tuple[int, int]):
    import halide as hl
    number = capability[0] * 10 + capability[1]
    for known, feature in CAPABILITIES:
        if number >= known:
            return getattr(hl.TargetFeature, feature)
    raise KernelCompileError(f"smelt: SMELT_CUDA_BACKEND=halide needs a GPU of CUDA capability 5.0 or newer, "
                             f"not {capability[0]}.{capability[1]}")


@functools.lru_cache(maxsize=None)
def runtime_target():
    import halide as hl
    return hl.get_host_target().with_feature(hl.TargetFeature.CUDA)


@functools.lru_cache(maxsize=None)
def kernel_target(capability: tuple[int, int]):
    """The host with CUDA for the device code; strict float as on the CPU (halide_compile); the
    user_context argument carries torch's context and stream to the shim; no runtime (shared)."""
    import halide as hl
    target = runtime_target().with_feature(capability_feature(capability))
    for feature in (hl.TargetFeature.StrictFloat, hl.TargetFeature.NoRuntime, hl.TargetFeature.UserContext):
        target = target.with_feature(feature)
    return target


def _compile_shim(out: str) -> None:
    run_cc(["-c", "-fPIC", "-O2", "-o", out, SHIM], f"compiling {SHIM}", "SMELT_CUDA_BACKEND")


def runtime_library(cache_dir: str) -> str:
    """Path of the shared Halide CUDA runtime (with smelt's shim) every GPU kernel links against."""
    import halide as hl
    with open(SHIM) as f:
        shim = f.read()
    path = os.path.join(_folder(cache_dir), f"{RUNTIME_NAME}_{_key(shim, runtime_target().to_string())[:12]}.so")

    def build(tmp: str) -> None:
        runtime, shim_object = os.path.join(tmp, "runtime.o"), os.path.join(tmp, "shim.o")
        hl.compile_standalone_runtime(runtime, runtime_target())
        _compile_shim(shim_object)
        # The shim's strong definitions replace the runtime's weak ones at this link.
        _link([shim_object, runtime], os.path.join(tmp, "out"), ["-lpthread", "-ldl", "-lm"])

    build_named_checked(path, build)
    return path


def kernel_library(name: str, source: str, cache_dir: str, capability: tuple[int, int],
                   path: str | None = None) -> tuple[str, str, float]:
    """Kernel `name` compiled for a GPU of `capability`: as halide_compile.kernel_library."""
    return host_kernel_library(name, source, cache_dir, path, kernel_target(capability), runtime_library(cache_dir))
