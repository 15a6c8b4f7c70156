"""Halide's CPU kernels run their parallel loops on torch's OpenMP threads.

Halide's runtime has its own thread pool. Beside torch's, the two oversubscribe the cores: after an
ATen op (a convolution), torch's OpenMP threads spin for a while waiting for more work, and a Halide
kernel called then waits on a worker the OS has not scheduled: on the 2-core CPU MobileNetV3's
first pointwise kernel, 0.94 ms alone, took 11.3 ms per call after the stem convolution
(benchmarks/probes/cpu_model_profile.py, RESULTS 2026-11-27). Measured again once the other costs
had gone (RESULTS 2026-11-27, fourth session): that kernel 195-222 -> 118-134 us alone and 317-346
-> 216-243 us right after the convolution; MobileNetV3-small 16.2-16.7 -> 11.2-11.9 ms a call.
SMELT_HALIDE_OPENMP=0 keeps Halide's own pool. A kernel's parallel loop is handed to
a small C function instead (`halide_set_custom_do_par_for`): one `omp parallel for`, which runs in
the libgomp torch loaded (the same soname) on the threads torch.set_num_threads sets. Its tasks are
dealt out statically, each thread a fixed block, as ATen's parallel_for does: a thread then finds
the part of a tensor it wrote last time still in its own L2 (a [4096, 64] float32 multiply alone,
2 cores: 41.5-43.5 us dealt dynamically, 25.0-26.2 statically; ATen 17; the probe
benchmarks/probes/halide_pointwise.py with and without --omp-schedule "dynamic, 1").
Where `cc -fopenmp` fails, Halide keeps its own pool (a debug line says so).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os

from ..errors import KernelCompileError
from .halide_compile import build_named_checked, run_cc

log = logging.getLogger("smelt.runtime")

SOURCE = r"""
typedef int (*halide_task_t)(void *user_context, int task_number, unsigned char *closure);

/* Halide's do_par_for: tasks min .. min + size - 1, any order; the first failure is returned. */
int smelt_do_par_for(void *user_context, halide_task_t task, int min, int size, unsigned char *closure) {
    int failed = 0;
    #pragma omp parallel for schedule(static) if (size > 1)
    for (int i = min; i < min + size; i++) {
        int status = task(user_context, i, closure);
        if (status != 0) {
            #pragma omp atomic write
            failed = status;
        }
    }
    return failed;
}
"""


def _shim_library(folder: str) -> str:
    path = os.path.join(folder, f"smelt_omp_par_for_{hashlib.sha256(SOURCE.encode()).hexdigest()[:12]}.so")

    def build(tmp: str) -> None:
        source = os.path.join(tmp, "par_for.c")
        with open(source, "w") as f:
            f.write(SOURCE)
        run_cc(["-O2", "-fPIC", "-fopenmp", "-shared", "-o", os.path.join(tmp, "out"), source],
               "compiling the OpenMP loop for Halide's parallel loops")
    build_named_checked(path, build)
    return path


def share_torch_threads(runtime: ctypes.CDLL, runtime_path: str) -> bool:
    """Routes the shared runtime's parallel loops to torch's OpenMP threads; False where the C
    compiler has no OpenMP (Halide's own pool is left in place)."""
    import torch  # noqa: F401  (its libgomp must be loaded first: the shim binds to it by soname)
    try:
        shim = ctypes.CDLL(_shim_library(os.path.dirname(runtime_path)))
    except (KernelCompileError, OSError) as e:
        log.debug("smelt: Halide kernels keep Halide's thread pool: %s", e)
        return False
    runtime.halide_set_custom_do_par_for.argtypes = [ctypes.c_void_p]
    runtime.halide_set_custom_do_par_for.restype = ctypes.c_void_p
    runtime.halide_set_custom_do_par_for(ctypes.cast(shim.smelt_do_par_for, ctypes.c_void_p))
    _keep.append(shim)
    installed.add(runtime_path)
    return True


_keep: list = []  # the shim stays loaded while the runtime may call it
installed: set[str] = set()  # runtimes whose parallel loops run on torch's OpenMP threads
# SMELT_HALIDE_OPENMP, as the compile that first loads a Halide kernel saw it (set by smelt.pipeline).
wanted = True
