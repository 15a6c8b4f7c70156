"""One FX graph through every stage: lower -> schedule -> codegen -> load."""
from __future__ import annotations

import itertools
import logging

import torch

from . import config as config_module
from . import observe
from .codegen.simd import plan_kernel
from .codegen.triton import BlockConfig, TritonKernel, TritonKernelSource, choose_blocks, index_dtype_for, kernel_name
from .codegen.wrapper import WrapperCodegen
from .debug import dump_graph
from .errors import KernelCompileError, SmeltError
from .lowering import lower_graph
from .runtime.compiled_graph import CompiledGraph
from .runtime.launcher import TritonLauncher
from .runtime.loader import load_module, source_path
from .scheduler import schedule as make_schedule

log = logging.getLogger("smelt")
_graph_ids = itertools.count()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str) -> CompiledGraph:
    cfg = config_module.current()
    graph_id = next(_graph_ids)
    graph = lower_graph(gm)
    sched = make_schedule(graph)
    # Each kernel runs on its own members' device: a graph may copy between devices.
    kernels: dict[int, TritonKernelSource] = {}
    interpreted: dict[int, bool] = {}
    for k, step in enumerate(sched.steps):
        if step.is_extern:
            continue
        device = step.group.nodes[0].buffer.get_device()
        backend = cfg.backend_for(device.type)
        if backend != "triton":
            raise SmeltError(f"smelt: backend {backend!r} for {device.type} tensors does not exist yet "
                             f"(set SMELT_{device.type.upper()}_BACKEND=triton)")
        interpreted[k] = device.type == "cpu"
        kernels[k] = generate_kernel(step, graph, interpreted[k], cfg, len(kernels))

    title = f"graph {graph_id} ({kind})"
    wrapper_source = WrapperCodegen(graph, sched, kernels, title).generate()
    namespace = {}
    kernel_paths = {}
    for k, kernel in kernels.items():
        interpret = interpreted[k]
        path = source_path(cfg.cache_dir, kernel.name, kernel.source)
        kernel_paths[kernel.name] = path
        try:
            module = load_module(path, interpret=interpret)
        except Exception as e:
            raise KernelCompileError(f"smelt: kernel {kernel.name} did not load; source: {path}; from ATen ops: "
                                     f"{', '.join(kernel.origins)}; error: {type(e).__name__}: {e}") from e
        xnumel_arg = len(kernel.params) + len(kernel.size_args)
        namespace[kernel.name] = TritonLauncher(getattr(module, kernel.name), kernel.name, path, kernel.origins,
                                                kernel.config, interpret, xnumel_arg)
    wrapper_path = source_path(cfg.cache_dir, f"wrapper_{kind}", wrapper_source)
    exec(compile(wrapper_source, wrapper_path, "exec"), namespace)
    for name, constant in graph.constants.items():
        namespace[name] = constant.value
    namespace.update(graph.subgraphs)

    compiled = CompiledGraph(
        kind=kind, call=namespace["call"], kernel_names=[k.name for k in kernels.values()],
        kernel_sources={k.name: k.source for k in kernels.values()}, kernel_paths=kernel_paths,
        fallback_ops=list(graph.fallback_ops), wrapper_source=wrapper_source, wrapper_path=wrapper_path)
    if cfg.debug_dir:
        files = {"aten_graph.txt": gm.print_readable(print_output=False), "ir.txt": graph.describe(),
                 "fused_groups.txt": sched.describe(), "wrapper.py": wrapper_source}
        files.update({f"{k.name}.py": k.source for k in kernels.values()})
        folder = dump_graph(cfg.debug_dir, kind, files)
        log.info("smelt: %s dumped to %s", title, folder)
    observe.record(compiled)
    return compiled


def generate_kernel(step, graph, interpret: bool, cfg, index: int) -> TritonKernelSource:
    plan = plan_kernel(step.group, step.stored)
    limit = cfg.persistent_reduction_limit
    if plan.has_scan:
        limit = min(limit, cfg.persistent_scan_limit)
    config: BlockConfig = choose_blocks(plan, interpret, limit)
    name = kernel_name(plan, config, index)
    kernel = TritonKernel(plan, config, graph, index_dtype_for(plan, graph), interpret)
    origins = sorted({o for n in plan.nodes for o in n.buffer.origins})
    members = ", ".join(f"{n.name} ({plan.placement[n.name]})" for n in plan.nodes)
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# iterates {plan.xnumel} x {plan.rnumel}; members: {members}; stores: {', '.join(plan.stored) or '-'}",
                f"# blocks: XBLOCK={config.XBLOCK} RBLOCK={config.RBLOCK} num_warps={config.num_warps}"
                f"{' persistent' if config.persistent else ''}"]
    if plan.tiling is not None:
        comments.append(plan.tiling.describe())
    source = kernel.source(name, interpret, comments)
    return TritonKernelSource(
        name=name, source=source, params=kernel.args.call_order(), size_args=list(kernel.args.sizes),
        xnumel=plan.xnumel, rnumel=plan.rnumel if plan.blocks_2d else None, config=config, origins=origins)
