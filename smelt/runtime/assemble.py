"""Builds the callable for one generated graph: writes and loads its kernels, runs the wrapper module."""
from __future__ import annotations

import importlib

from ..artifact import GeneratedGraph, GeneratedKernel
from ..backend_registry import BACKENDS
from ..errors import KernelCompileError
from ..progress import Progress
from .compiled_graph import CompiledGraph
from .cuda_graphs import GraphedCall
from .loader import source_path


def assemble(generated: GeneratedGraph, cache_dir: str, keep_kernels: bool, cuda_graphs: bool = False,
             progress_bar: bool = False) -> CompiledGraph:
    """`keep_kernels`: GPU kernels' compiled binaries are kept in `cache_dir` (see kernel_binaries).
    `cuda_graphs`: a graph on CUDA is called through CUDA graph recordings (see cuda_graphs.py).
    `progress_bar`: a slow build draws a bar on a terminal (smelt/progress.py)."""
    namespace = {}
    kernel_paths = {}
    progress = Progress(generated.title, len(generated.kernels), bar=progress_bar)
    for kernel in generated.kernels:
        path = source_path(cache_dir, kernel.name, kernel.source)
        kernel_paths[kernel.name] = path
        namespace[kernel.name] = loader(kernel)(kernel, path, cache_dir, keep_kernels)
        progress.step()
    progress.close()
    wrapper_path = source_path(cache_dir, f"wrapper_{generated.kind}", generated.wrapper_source)
    exec(compile(generated.wrapper_source, wrapper_path, "exec"), namespace)
    namespace.update(generated.objects)
    call = namespace["call"]
    if cuda_graphs and "cuda" in namespace["GRAPH_DEVICE_TYPES"]:
        call = GraphedCall(call, generated.title, namespace["size_key"], namespace["MUTATED_INPUTS"],
                           namespace["CUDA_GRAPH_BLOCKERS"])
    return CompiledGraph(
        kind=generated.kind, call=call, kernel_names=[k.name for k in generated.kernels],
        kernel_sources={k.name: k.source for k in generated.kernels}, kernel_paths=kernel_paths,
        fallback_ops=list(generated.fallback_ops), wrapper_source=generated.wrapper_source,
        wrapper_path=wrapper_path, cache_key=generated.cache_key)


def loader(kernel: GeneratedKernel):
    """The `load` function of the runtime module the registry names for the kernel's backend."""
    if kernel.backend not in BACKENDS:
        raise KernelCompileError(f"smelt: kernel {kernel.name} is for backend {kernel.backend!r}, which this "
                                 f"runtime cannot load (known: {', '.join(sorted(BACKENDS))})")
    return importlib.import_module(BACKENDS[kernel.backend].runtime).load
