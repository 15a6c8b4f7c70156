"""Builds the callable for one generated graph: writes and loads its kernels, runs the wrapper module."""
from __future__ import annotations

import importlib
import time

from ..artifact import GeneratedGraph, GeneratedKernel
from ..backend_registry import BACKENDS
from ..errors import KernelCompileError
from ..progress import Progress
from .compiled_graph import CompiledGraph
from .cuda_graphs import GraphedCall
from .kernel_binaries import keep_binaries_in
from .loader import source_path


def assemble(generated: GeneratedGraph, cache_dir: str, keep_kernels: bool, cuda_graphs: bool = False,
             progress_bar: bool = False, compile_workers: int = 1, defer_builds: bool = False,
             builds_waited=None) -> CompiledGraph:
    """`keep_kernels`: GPU kernels' compiled binaries are kept in `cache_dir` (see kernel_binaries).
    `cuda_graphs`: a graph on CUDA is called through CUDA graph recordings (see cuda_graphs.py).
    `progress_bar`: a slow build draws a bar on a terminal (smelt/progress.py).
    `compile_workers`: processes a backend may compile kernels in at once (its `build_ahead`).
    `defer_builds`: kernels whose binaries are first needed at their launch (Triton's) may still be
    compiling when this returns; the graph's first call waits for them, then calls
    `builds_waited(graph, seconds)`."""
    namespace = {}
    keep_binaries_in(cache_dir if keep_kernels else None)
    kernel_paths = {k.name: source_path(cache_dir, k.name, k.source) for k in generated.kernels}
    building = []  # compile_pool.Batch-es the first call waits for
    if compile_workers > 1:
        for backend in sorted({k.backend for k in generated.kernels}):
            module = runtime_module(backend)
            build_ahead = getattr(module, "build_ahead", None)
            if build_ahead is None:
                continue
            kernels = [k for k in generated.kernels if k.backend == backend]
            if defer_builds and getattr(module, "BINARIES_AT_FIRST_LAUNCH", False):
                batch = build_ahead(kernels, kernel_paths, cache_dir, compile_workers, keep_kernels, wait=False)
                building += [batch] if batch is not None else []
            else:  # kernels compiled in parallel, then loaded below from the cache
                build_ahead(kernels, kernel_paths, cache_dir, compile_workers, keep_kernels)
    progress = Progress(generated.title, len(generated.kernels), bar=progress_bar)
    for kernel in generated.kernels:
        namespace[kernel.name] = loader(kernel)(kernel, kernel_paths[kernel.name], cache_dir, keep_kernels)
        progress.step()
    progress.close()
    wrapper_path = source_path(cache_dir, f"wrapper_{generated.kind}", generated.wrapper_source)
    exec(compile(generated.wrapper_source, wrapper_path, "exec"), namespace)
    namespace.update(generated.objects)
    call = namespace["call"]
    if cuda_graphs and "cuda" in namespace["GRAPH_DEVICE_TYPES"]:
        call = GraphedCall(call, generated.title, namespace["size_key"], namespace["MUTATED_INPUTS"],
                           namespace["CUDA_GRAPH_BLOCKERS"])
    compiled = CompiledGraph(
        kind=generated.kind, call=call, kernel_names=[k.name for k in generated.kernels],
        kernel_sources={k.name: k.source for k in generated.kernels}, kernel_paths=kernel_paths,
        fallback_ops=list(generated.fallback_ops), wrapper_source=generated.wrapper_source,
        wrapper_path=wrapper_path, cache_key=generated.cache_key,
        planned_peak_bytes=namespace.get("PLANNED_PEAK_BYTES"), namespace=namespace)
    if building:
        compiled.call = _AfterBuilds(compiled, building, call, builds_waited)
    return compiled


class _AfterBuilds:
    """A graph's call until its first: waits for its kernels' builds, then leaves the plain call,
    `call`, in its place."""

    def __init__(self, graph: CompiledGraph, building: list, call, waited=None):
        self.graph, self.building, self.call, self.waited = graph, building, call, waited

    def __call__(self, args):
        start = time.perf_counter()
        for batch in self.building:
            batch.wait()
        if self.waited is not None:
            self.waited(self.graph, time.perf_counter() - start)
        self.graph.call = self.call
        return self.call(args)


def runtime_module(backend: str):
    """The runtime module the registry names for a backend."""
    if backend not in BACKENDS:
        raise KernelCompileError(f"smelt: a kernel is for backend {backend!r}, which this runtime cannot load "
                                 f"(known: {', '.join(sorted(BACKENDS))})")
    return importlib.import_module(BACKENDS[backend].runtime)


def loader(kernel: GeneratedKernel):
    """The `load` function of the runtime module the registry names for the kernel's backend."""
    if kernel.backend not in BACKENDS:
        raise KernelCompileError(f"smelt: kernel {kernel.name} is for backend {kernel.backend!r}, which this "
                                 f"runtime cannot load (known: {', '.join(sorted(BACKENDS))})")
    return runtime_module(kernel.backend).load
