"""How a Triton kernel's GeneratedKernel becomes what the wrapper calls: its module imported (under
the interpreter for CPU kernels), wrapped in a launcher with its autotuner, binaries and checks."""
from __future__ import annotations

import os
import threading

import torch

from ..artifact import GeneratedKernel
from ..errors import KernelCompileError
from .autotune import Autotuner
from .combo_launcher import ComboLauncher, launch_description
from .compile_pool import submit
from .cuda_binary import keep_launcher_in
from .cuda_compile_check import CAPABILITY, CudaCompileCheck
from .kernel_binaries import KernelVariants, folder_for, variant_key
from .launcher import TritonLauncher, appended_description, block_constants
from .loader import DeferredKernel, load_module, source_path
from . import table_writer
from .table_writer import writer_for
from .triton_cubin import compile_options

# A kernel's binary is looked for at its first launch, not when it is loaded: a graph's builds may
# still run when it is assembled (assemble's `defer_builds`).
BINARIES_AT_FIRST_LAUNCH = True

# CPU tables are host tensors. The tests write them with the interpreted writer instead, to check on
# the CPU the logic of the GPU's written tables (tests/test_combo_tables.py).
WRITE_CPU_TABLES = False


def build_ahead(kernels: list[GeneratedKernel], paths: dict[str, str], cache_dir: str, workers: int,
                keep_kernels: bool, wait: bool = True):
    """The GPU binaries of kernels whose launch codegen could describe (GeneratedKernel.launch_guess),
    compiled `workers` at a time into the cache (compile_pool.py), where their first launch finds
    them. Also the CUDA forms that SMELT_CHECK_CUDA_COMPILE compiles for interpreted kernels.
    `wait=False`: returns the compile_pool.Batch still compiling (None when there is nothing to
    compile), which must be waited for before the first launch."""
    if workers < 2 or not keep_kernels:  # binaries are found only where they are kept
        return None
    jobs = {}
    for kernel in kernels:
        for job in _ahead_jobs(kernel, paths[kernel.name], cache_dir):
            jobs[job["folder"]] = job  # kernels alike compile once
        if kernel.combo and not kernel.interpret:  # the writers of its pointer table
            member_sizes, member_kinds, pointers_per_kind = kernel.combo[:3]
            count = sum(pointers_per_kind[k] + len(sizes) for sizes, k in zip(member_sizes, member_kinds))
            for job in table_writer.ahead_jobs(count, cache_dir, torch.cuda.get_device_capability()):
                if not os.path.isdir(job["folder"]):
                    jobs[job["folder"]] = job
    with _building_lock:
        for folder in [f for f, b in _building.items() if b.done]:
            del _building[folder]
        # A binary an earlier graph's batch is still building (a backward's kernel its forward has
        # too, a graph alike another's) is waited for, not built again.
        earlier = {id(b): b for f, b in _building.items() if f in jobs}
        for folder in [f for f in jobs if f in _building]:
            del jobs[folder]
        if not jobs and not earlier:
            return None
        batch = submit(list(jobs.values()), workers, after=tuple(earlier.values()))
        _building.update((folder, batch) for folder in jobs)
    if wait:
        batch.wait()
        return None
    return batch


# Binary folder -> the batch building it, while it builds (build_ahead).
_building: dict[str, object] = {}
_building_lock = threading.Lock()


def _ahead_jobs(kernel: GeneratedKernel, path: str, cache_dir: str) -> list[dict]:
    """The builds of a kernel's binaries: one per block configuration its first launch may time."""
    if kernel.combo:
        if len(kernel.candidates) > 1:  # a tuned combo's tables differ per config: built as timed
            return []
        guess = launch_description(kernel.combo[-1])
    elif kernel.launch_guess is not None:
        guess = kernel.launch_guess
    else:
        return []
    if kernel.interpret:
        twin = kernel.cuda_twin
        if twin is None:
            return []
        name, source, configs, workspace, ticket = twin.name, twin.source, [twin.config], twin.workspace, twin.ticket
        path, capability = source_path(cache_dir, twin.name, twin.source), CAPABILITY
    else:
        name, source, configs, workspace, ticket = kernel.name, kernel.source, list(kernel.candidates), \
            kernel.workspace, kernel.ticket
        capability = torch.cuda.get_device_capability()
    spec = guess + appended_description(workspace, ticket)
    jobs = []
    for config in configs:
        constexprs = block_constants(config, bool(kernel.combo), workspace[0] if workspace is not None else None)
        folder = folder_for(cache_dir, variant_key(source, spec, constexprs, config.num_warps, capability))
        if not os.path.isdir(folder):  # else kept already
            jobs.append({"backend": "triton", "name": name, "path": path, "spec": spec, "constexprs": constexprs,
                         "num_warps": config.num_warps, "capability": list(capability),
                         "options": compile_options(source), "folder": folder, "cache_dir": cache_dir})
    return jobs


def load(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    def failed(e: Exception) -> KernelCompileError:
        return KernelCompileError(f"smelt: kernel {kernel.name} did not load; source: {path}; from ATen ops: "
                                  f"{', '.join(kernel.origins)}; error: {type(e).__name__}: {e}")

    if kernel.interpret:  # the interpreter runs the function itself
        try:
            fn = getattr(load_module(path, interpret=True), kernel.name)
        except Exception as e:
            raise failed(e) from e
    else:  # imported only if no kept binary launches it
        fn = DeferredKernel(path, kernel.name, failed)
    tuner = Autotuner(kernel.source, list(kernel.candidates), cache_dir, kernel.name) \
        if len(kernel.candidates) > 1 else None
    variants = None if kernel.interpret else KernelVariants(fn, kernel.source, cache_dir if keep_kernels else None)
    if not kernel.interpret:
        keep_launcher_in(cache_dir)  # the C launcher is kept there whether kernels are or not
    check = None
    if kernel.cuda_twin is not None:  # SMELT_CHECK_CUDA_COMPILE
        twin_path = source_path(cache_dir, kernel.cuda_twin.name, kernel.cuda_twin.source)
        check = CudaCompileCheck(kernel.cuda_twin, twin_path, list(kernel.origins), cache_dir if keep_kernels else None)
    if kernel.combo:  # tuned by its ComboLauncher, which builds the tables each config needs
        programs = ComboLauncher.programs(kernel.combo, kernel.config.XBLOCK)
        launcher = TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                                  kernel.xnumel_arg, variants=variants, programs=programs, cuda_check=check,
                                  options=compile_options(kernel.source))
        writer = writer_for(cache_dir if keep_kernels else None, kernel.interpret) \
            if not kernel.interpret or WRITE_CPU_TABLES else None
        return ComboLauncher(launcher, *kernel.combo, autotuner=tuner, writer=writer)
    return TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                          kernel.xnumel_arg, kernel.workspace, tuner, variants, kernel.ticket, cuda_check=check,
                          options=compile_options(kernel.source))
