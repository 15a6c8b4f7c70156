"""Builds the callable for one generated graph: writes and loads its kernels, runs the wrapper module."""
from __future__ import annotations

from ..codegen.generated import GeneratedGraph, GeneratedKernel
from ..errors import KernelCompileError
from .autotune import Autotuner
from .combo_launcher import ComboLauncher
from .compiled_graph import CompiledGraph
from .cuda_compile_check import CudaCompileCheck
from .halide_cuda_launcher import halide_launcher
from .kernel_binaries import KernelVariants
from .launcher import TritonLauncher
from .loader import load_module, source_path


def assemble(generated: GeneratedGraph, cache_dir: str, keep_kernels: bool) -> CompiledGraph:
    """`keep_kernels`: GPU kernels' compiled binaries are kept in `cache_dir` (see kernel_binaries)."""
    namespace = {}
    kernel_paths = {}
    for kernel in generated.kernels:
        path = source_path(cache_dir, kernel.name, kernel.source)
        kernel_paths[kernel.name] = path
        try:
            load = LOADERS[kernel.backend]
        except KeyError:
            raise KernelCompileError(f"smelt: kernel {kernel.name} is for backend {kernel.backend!r}, which this "
                                     f"runtime cannot load (known: {', '.join(sorted(LOADERS))})") from None
        namespace[kernel.name] = load(kernel, path, cache_dir, keep_kernels)
    wrapper_path = source_path(cache_dir, f"wrapper_{generated.kind}", generated.wrapper_source)
    exec(compile(generated.wrapper_source, wrapper_path, "exec"), namespace)
    namespace.update(generated.objects)
    return CompiledGraph(
        kind=generated.kind, call=namespace["call"], kernel_names=[k.name for k in generated.kernels],
        kernel_sources={k.name: k.source for k in generated.kernels}, kernel_paths=kernel_paths,
        fallback_ops=list(generated.fallback_ops), wrapper_source=generated.wrapper_source,
        wrapper_path=wrapper_path, cache_key=generated.cache_key)


def _load_halide(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    return halide_launcher(kernel.name, kernel.source, list(kernel.origins), cache_dir, path)


def _load_triton(kernel: GeneratedKernel, path: str, cache_dir: str, keep_kernels: bool):
    try:
        module = load_module(path, interpret=kernel.interpret)
    except Exception as e:
        raise KernelCompileError(f"smelt: kernel {kernel.name} did not load; source: {path}; from ATen ops: "
                                 f"{', '.join(kernel.origins)}; error: {type(e).__name__}: {e}") from e
    fn = getattr(module, kernel.name)
    tuner = Autotuner(kernel.source, list(kernel.candidates), cache_dir) if len(kernel.candidates) > 1 else None
    variants = None if kernel.interpret else KernelVariants(fn, kernel.source, cache_dir if keep_kernels else None)
    check = None
    if kernel.cuda_twin is not None:  # SMELT_CHECK_CUDA_COMPILE
        twin_path = source_path(cache_dir, kernel.cuda_twin.name, kernel.cuda_twin.source)
        check = CudaCompileCheck(kernel.cuda_twin, twin_path, list(kernel.origins), cache_dir if keep_kernels else None)
    if kernel.combo:  # tuned by its ComboLauncher, which builds the tables each config needs
        programs = ComboLauncher.programs(kernel.combo, kernel.config.XBLOCK)
        launcher = TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                                  kernel.xnumel_arg, variants=variants, programs=programs, cuda_check=check)
        return ComboLauncher(launcher, *kernel.combo, autotuner=tuner)
    return TritonLauncher(fn, kernel.name, path, list(kernel.origins), kernel.config, kernel.interpret,
                          kernel.xnumel_arg, kernel.workspace, tuner, variants, kernel.ticket, cuda_check=check)


# How the runtime loads a kernel of each backend, by the name its GeneratedKernel records.
LOADERS = {"halide": _load_halide, "triton": _load_triton}
