"""One FX graph through every stage: lower -> schedule -> codegen -> load."""
from __future__ import annotations

import itertools
import logging

import torch

from . import config as config_module
from . import graph_cache, observe
from .codegen.triton.candidates import candidates, masks_needed
from .codegen.generated import CudaTwin, GeneratedGraph, GeneratedKernel
from .codegen.halide.kernel import HalideKernel, HalideKernelSource, halide_kernel_name
from .codegen.halide.gpu_schedule import HalideGpuSchedule
from .codegen.halide.ops import UnsupportedInHalide
from .codegen.halide.schedule import HalideSchedule
from .codegen.simd import plan_kernel
from .codegen.triton.kernel import BlockConfig, TritonKernel, TritonKernelSource, choose_blocks, index_dtype_for, kernel_name
from .codegen.triton.combo import ComboBodies, ComboKernelSource, combo_kernel
from .codegen.triton.finisher import Finisher, attach_finishers, finisher_plan
from .codegen.wrapper import WrapperCodegen
from .debug import dump_graph
from .errors import HalideRefusedKernel, SmeltError
from .lowering import lower_graph
from .lowering.gemm_epilogue import fuse_gemm_epilogues
from .runtime.assemble import assemble
from .runtime.compiled_graph import CompiledGraph
from .scheduler import schedule as make_schedule
from .scheduler.combo import combine, is_merge_key, merge_key

log = logging.getLogger("smelt")
_graph_ids = itertools.count()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str) -> CompiledGraph:
    cfg = config_module.current()
    generated = graph_cache.load_or_generate(gm, kind, cfg, generate_graph)
    refused: set[str] = set()
    while True:
        try:
            compiled = assemble(generated, cfg.cache_dir, graph_cache.enabled(cfg))
            break
        except HalideRefusedKernel as e:
            # Halide's own compiler rejects some valid programs (issue 20's fuzz finding Halide #4):
            # that kernel runs in Triton instead, and the cache keeps the graph that compiled.
            if e.kernel in refused:
                raise
            refused.add(e.kernel)
            log.warning("smelt: %s runs in Triton instead of Halide: %s", e.kernel, e)
            regenerated = generate_graph(gm, kind, cfg, halide_refused=frozenset(refused))
            graph_cache.replace(generated, regenerated, cfg)
            generated = regenerated
    compiled.kind = kind
    observe.record(compiled)
    return compiled


def generate_graph(gm: torch.fx.GraphModule, kind: str, cfg, halide_refused=frozenset()) -> GeneratedGraph:
    """`halide_refused`: names of kernels Halide did not compile before, generated in Triton instead."""
    graph_id = next(_graph_ids)
    if cfg.gemm_epilogues:
        fuse_gemm_epilogues(gm)
    graph = lower_graph(gm, cfg)
    sched = make_schedule(graph)

    def is_triton(step) -> bool:
        return _backend_of(step, cfg) == "triton"

    bodies = ComboBodies(graph, lambda step: step.group.nodes[0].buffer.get_device().type == "cpu", cfg.eviction_hints,
                         cfg.persistent_reduction_limit, sched.steps)
    outputs = {o.name for o in graph.outputs if o.name is not None}
    # A reduction whose last program can finish the small reductions of its results after it takes
    # them into its launch. Such a pair stays out of combos, unless alike pairs (a split norm per
    # tensor) fill two combos: fewer launches than one per pair.
    finishing = finisher_plan(sched.steps, cfg.persistent_reduction_limit, is_triton)
    lone = {id(big) for big in finishing.values() if not bodies.alike(big)}
    paired = lone | {small for small, big in finishing.items() if id(big) in lone}

    def key_of(step):
        if id(step) in paired:
            return None
        # Triton kernels share launches as combo kernels; tiny Halide ones merge into one kernel.
        return bodies.key(step) if is_triton(step) else merge_key(step)

    sched.steps = combine(sched.steps, key_of, outputs, graph, merge=is_merge_key)
    sched.steps = attach_finishers(sched.steps, cfg.persistent_reduction_limit, is_triton)
    # Each kernel runs on its own members' device: a graph may copy between devices.
    kernels: dict[int, TritonKernelSource | ComboKernelSource | HalideKernelSource] = {}
    interpreted: dict[int, bool] = {}
    backends: dict[int, str] = {}
    twins: dict[int, CudaTwin | None] = {}  # SMELT_CHECK_CUDA_COMPILE: interpreted kernels' CUDA forms
    for k, step in enumerate(sched.steps):
        if step.is_extern:
            continue
        backends[k] = _backend_of(step, cfg)
        interpreted[k] = step.group.nodes[0].buffer.get_device().type == "cpu" and backends[k] == "triton"
        if backends[k] == "halide":
            kernels[k] = _halide_or_triton(step, graph, len(kernels), cfg, halide_refused)
            if not isinstance(kernels[k], HalideKernelSource):
                backends[k] = "triton"
                interpreted[k] = step.group.nodes[0].buffer.get_device().type == "cpu"
        elif step.combo:
            kernels[k] = combo_kernel(step, bodies, graph, interpreted[k], len(kernels), cfg.autotune)
        else:
            kernels[k] = generate_kernel(step, graph, interpreted[k], cfg, len(kernels))
        if interpreted[k] and cfg.check_cuda_compile:
            twins[k] = _cuda_twin(step, kernels[k], graph, cfg, len(kernels) - 1, sched.steps)

    title = f"graph {graph_id} ({kind})"
    wrapper_source = WrapperCodegen(graph, sched, kernels, title).generate()
    objects = {name: constant.value for name, constant in graph.constants.items()}
    objects.update(graph.subgraphs)
    generated = GeneratedGraph(
        kind=kind, title=title, wrapper_source=wrapper_source, fallback_ops=list(graph.fallback_ops), objects=objects,
        kernels=[_generated_kernel(kernel, interpreted[k], backends[k], twins.get(k)) for k, kernel in kernels.items()])
    if cfg.debug_dir:
        files = {"aten_graph.txt": gm.print_readable(print_output=False), "ir.txt": graph.describe(),
                 "fused_groups.txt": sched.describe(), "wrapper.py": wrapper_source}
        files.update({f"{k.name}.py": k.source for k in kernels.values()})
        files.update({f"{t.name}.cuda.py": t.source for t in twins.values() if t is not None})
        folder = dump_graph(cfg.debug_dir, kind, files)
        log.info("smelt: %s dumped to %s", title, folder)
    return generated


def _backend_of(step, cfg) -> str:
    device = step.group.nodes[0].buffer.get_device()
    backend = cfg.backend_for(device.type)
    if backend not in ("triton", "halide") or (backend == "halide" and device.type not in ("cpu", "cuda")):
        raise SmeltError(f"smelt: backend {backend!r} for {device.type} tensors does not exist "
                         f"(set SMELT_{device.type.upper()}_BACKEND=triton)")
    return backend


def _cuda_twin(step, kernel, graph, cfg, index: int, steps) -> CudaTwin | None:
    """The kernel the GPU would run for `step`, for SMELT_CHECK_CUDA_COMPILE: generated again with
    interpret=False (its blocks, libdevice calls and conversions are the GPU's, not the interpreter's)."""
    if isinstance(kernel, ComboKernelSource):
        bodies = ComboBodies(graph, lambda s: False, cfg.eviction_hints, cfg.persistent_reduction_limit, steps)
        if any(bodies.body(m) is None for m in step.combo):  # on the GPU these would not be one combo
            log.info("smelt: %s is not checked for CUDA: its members would not be combined there", kernel.name)
            return None
        twin = combo_kernel(step, bodies, graph, False, index)
        return CudaTwin(name=twin.name, source=twin.source, config=twin.config, workspace=None, ticket=False,
                        combo=True)
    twin = generate_kernel(step, graph, False, cfg, index)
    if (twin.params, twin.size_args) != (kernel.params, kernel.size_args):
        # The check launches the CUDA form with the interpreted kernel's arguments.
        raise SmeltError(f"smelt: kernel {kernel.name} takes other arguments in its CUDA form ({twin.name})")
    return CudaTwin(name=twin.name, source=twin.source, config=twin.config, workspace=twin.workspace,
                    ticket=twin.ticket, combo=False)


def _generated_kernel(kernel, interpret: bool, backend: str, twin: CudaTwin | None = None) -> GeneratedKernel:
    if backend == "halide":
        return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins), config=None,
                               candidates=(), workspace=None, backend="halide", interpret=False,
                               xnumel_arg=len(kernel.params) + len(kernel.size_args))
    if isinstance(kernel, ComboKernelSource):
        return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins),
                               config=kernel.config, candidates=tuple(kernel.candidates), workspace=None, xnumel_arg=-1,
                               interpret=interpret, combo=kernel.launch, cuda_twin=twin)
    return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins),
                           config=kernel.config, candidates=tuple(kernel.candidates), workspace=kernel.workspace,
                           ticket=kernel.ticket, xnumel_arg=len(kernel.params) + len(kernel.size_args),
                           interpret=interpret, cuda_twin=twin)


def _halide_or_triton(step, graph, index: int, cfg, refused=frozenset()):
    """A Halide kernel; one that Halide cannot print, or did not compile before (`refused`), runs in
    Triton instead (on the CPU, through Triton's interpreter: slow, but the graph still compiles and
    computes what eager does)."""
    gpu = step.group.nodes[0].buffer.get_device().type == "cuda"
    try:
        kernel = generate_halide_kernel(step, graph, index, gpu)
        if kernel.name not in refused:  # compile_graph warned of a refused one
            return kernel
    except UnsupportedInHalide as e:
        log.warning("smelt: kernel %d runs in Triton%s instead of Halide: %s", index,
                    "" if gpu else "'s interpreter", e)
    return generate_kernel(step, graph, not gpu, cfg, index)


def generate_halide_kernel(step, graph, index: int, gpu: bool = False) -> HalideKernelSource:
    plan = plan_kernel(step.group, step.stored)
    name = halide_kernel_name(plan, index)
    kernel = HalideKernel(plan, graph, HalideGpuSchedule if gpu else HalideSchedule)
    origins = sorted({o for n in plan.nodes for o in n.buffer.origins})
    members = ", ".join(f"{n.name} ({plan.placement[n.name]})" for n in plan.nodes)
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# iterates {plan.xnumel} x {plan.rnumel}; members: {members}; stores: {', '.join(plan.stored) or '-'}"]
    try:
        source = kernel.source(name, comments)
    except SmeltError as e:
        # The kind is kept: on CUDA an UnsupportedInHalide sends the kernel to Triton.
        kind = UnsupportedInHalide if isinstance(e, UnsupportedInHalide) else SmeltError
        raise kind(f"{e} (kernel {name}, from ATen ops: {', '.join(origins)})") from e
    params, sizes = kernel.launch_args()
    return HalideKernelSource(name=name, source=source, params=params, size_args=sizes, xnumel=plan.xnumel,
                              rnumel=plan.rnumel if plan.blocks_2d else None, origins=origins)


def tunable(step) -> bool:
    """Whether launching the kernel again leaves the same result: no input written in place,
    no scatter accumulating into its target."""
    return all(n.write_name == n.name and not n.is_scatter for n in step.group.nodes)


def _plan_and_blocks(step, interpret: bool, cfg):
    plan = plan_kernel(step.group, step.stored)
    limit = cfg.persistent_reduction_limit
    if plan.has_scan:
        limit = min(limit, cfg.persistent_scan_limit)
    return plan, choose_blocks(plan, interpret, limit)


def _describe(plan, config: BlockConfig, extra: str = "") -> list[str]:
    members = ", ".join(f"{n.name} ({plan.placement[n.name]})" for n in plan.nodes)
    return [f"# iterates {plan.xnumel} x {plan.rnumel}; members: {members}; stores: {', '.join(plan.stored) or '-'}",
            f"# blocks: XBLOCK={config.XBLOCK} RBLOCK={config.RBLOCK} num_warps={config.num_warps}"
            f"{' persistent' if config.persistent else ''}{extra}"]


def generate_kernel(step, graph, interpret: bool, cfg, index: int) -> TritonKernelSource:
    plan, config = _plan_and_blocks(step, interpret, cfg)
    configs = candidates(plan, config) if cfg.autotune and tunable(step) and not step.finishers else [config]
    name = kernel_name(plan, config, index)
    finisher, stages = None, []
    for k, small in enumerate(step.finishers):
        small_plan, small_config = _plan_and_blocks(small, interpret, cfg)
        ready = frozenset(step.stored).union(*(f.stored for f in step.finishers[:k]))
        stages.append((TritonKernel(small_plan, small_config, graph, index_dtype_for(small_plan, graph), interpret,
                                    eviction_hints=cfg.eviction_hints, program_arg=True, coherent=ready),
                       f"{name}_finish{k}"))
    if stages:
        finisher = Finisher(stages)
    kernel = TritonKernel(plan, config, graph, index_dtype_for(plan, graph), interpret, masks_needed(plan, configs),
                          cfg.eviction_hints, finisher=finisher)
    nodes = plan.nodes + [n for small in step.finishers for n in small.group.nodes]
    origins = sorted({o for n in nodes for o in n.buffer.origins})
    comments = [f"# aten ops: {', '.join(origins)}"]
    comments += _describe(plan, config, f"; autotuned over {len(configs)} configs" if len(configs) > 1 else "")
    for small_kernel, small_name in stages:
        comments.append(f"# then its last program runs {small_name}:")
        comments += _describe(small_kernel.plan, small_kernel.config)
    if plan.tiling is not None:
        comments.append(plan.tiling.describe())
    source = kernel.source(name, interpret, comments)
    workspace = (config.row_split, kernel.row_split.barriers, kernel.row_split.slots) if kernel.row_split else None
    params, sizes = kernel.launch_args()
    return TritonKernelSource(
        name=name, source=source, params=params, size_args=sizes,
        xnumel=plan.xnumel, rnumel=plan.rnumel if plan.blocks_2d else None, config=config, origins=origins,
        candidates=configs, workspace=workspace, ticket=finisher is not None)
