"""One FX graph through every stage: lower -> schedule -> codegen -> load."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time

import torch

from . import config as config_module
from . import compile_stages, graph_cache, observe
from .artifact import GeneratedGraph
from .codegen import backends
from .codegen.halide.schedule import ROW_DOMAIN
from .codegen.halide.pieces import PIECE_DOMAIN
from .codegen.wrapper import WrapperCodegen
from .compile_stages import StageClock
from .debug import dump_graph
from .errors import HalideRefusedKernel
from .lowering import lower_graph
from .lowering.gemm_epilogue import fuse_gemm_epilogues
from .lowering.fx_clones import drop_copies_before_layout_free_readers, drop_redundant_clones
from .lowering.frozen_weights import fold_weights
from .lowering.eager_refusals import refuse_as_eager
from .lowering.fx_cse import merge_common_subexpressions
from .lowering.layout_plan import plan_layouts
from .saved_inputs import saved_outputs_start
from .runtime import halide_threads, jit_ahead
from .runtime.assemble import assemble
from .runtime.compiled_graph import CompiledGraph
from .scheduler import schedule as make_schedule
from .scheduler.memory_order import order_for_memory
from .scheduler.combo import combine, is_merge_key
from .target import H100, Target, switched_on
from .scheduler.finishers import attach_finishers, finisher_plan
from .scheduler.live_bytes import buffer_sizes
from .scheduler.pool import plan_pool
from .scheduler.reuse import plan_reuse
from .scheduler.workspace import plan_workspace

log = logging.getLogger("smelt")
_graph_ids = itertools.count()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str) -> CompiledGraph:
    cfg = config_module.current()
    clock = StageClock()
    planned = False

    def plan() -> list | None:
        nonlocal planned
        planned = True
        with clock.stage("plan"):
            refuse_as_eager(gm)
            merge_common_subexpressions(gm)
            drop_redundant_clones(gm)
            drop_copies_before_layout_free_readers(gm)
            target_for = targets_for(cfg)
            layout = plan_layouts(gm, kind, _wants(cfg, "channels_last", "channels_last_convolutions"),
                                  _wants_padded_products(cfg),
                                  lambda device: target_for(device.type).copies_convolution_weights)
            jit_ahead.submit_for_graph(gm, cfg.compile_workers)  # compiled while the graph is lowered
            return layout

    def plan_and_generate(gm, kind, cfg, **kw) -> GeneratedGraph:
        # The layouts are planned after the cache lookup: a hit skips the re-trace. The graph is
        # keyed as traced; the plan is a function of it, the settings and the backend's Target.
        layout = plan()
        generated = generate_graph(gm, kind, cfg, clock=clock, **kw)
        if layout is not None:
            generated.output_strides, generated.padded_saved = layout
        return generated

    folded = None
    if kind == "inference" and gm.meta.get("smelt_frozen_weights"):
        # Before the cache lookup: the graph keyed is the one left after the move.
        folded = fold_weights(gm, gm.meta["smelt_frozen_weights"], _wants(cfg, "channels_last", "channels_last_convolutions"))
    start = time.perf_counter()
    # The layout plan treats a forward's saved values apart from what the caller sees.
    context = f"saved from {saved_outputs_start()}" if kind == "forward" else ""
    if gm.meta.get("smelt_donated_inputs"):  # the backward may write over these (scheduler/reuse.py)
        context += f" donated {sorted(gm.meta['smelt_donated_inputs'])}"
    if gm.meta.get("smelt_padded_saved"):  # saved values that arrive as padded rows (layout_plan.py)
        context += f" padded {sorted(gm.meta['smelt_padded_saved'].items())}"
    generated = graph_cache.load_or_generate(gm, kind, cfg, plan_and_generate, context)
    clock.add("cache", time.perf_counter() - start - sum(clock.seconds.values()))
    _compile_subgraphs_read_back(gm, generated)
    if generated.output_strides is not None and kind == "forward":
        _report_output_strides(generated.output_strides)
    plain: set[str] = set()  # refused once: generated again in a plainer form
    refused: set[str] = set()  # refused twice: generated in Triton
    while True:
        try:
            halide_threads.wanted = cfg.halide_openmp  # read when the process first loads a Halide kernel
            with clock.stage("load"):
                # A training graph's GPU kernels still compile when it returns: the forward's while
                # its backward is lowered (backend.py), the backward's while the forward first runs.
                compiled = assemble(generated, cfg.cache_dir, graph_cache.enabled(cfg), cfg.cuda_graphs, cfg.progress,
                                    cfg.compile_workers, defer_builds=kind in ("forward", "backward"),
                                    builds_waited=_count_waited_builds)
            config_module.note_interpreted_cpu_kernels(generated.kernels)
            break
        except HalideRefusedKernel as e:
            # Halide's own compiler rejects some valid programs (issue 20's fuzz finding Halide #4):
            # that kernel runs in Triton instead, and the cache keeps the graph that compiled.
            if e.kernel in refused:
                raise
            # Halide 21's bounds inference fails on some Funcs over r alone (a weighted NLL's backward),
            # and a later Halide may refuse ROW_DOMAIN's fusion: a kernel holding either is generated
            # again in its plain form before it goes to Triton.
            if e.kernel not in plain and any(k.name == e.kernel and _has_plain_form(k.source) for k in generated.kernels):
                plain.add(e.kernel)
                log.debug("smelt: %s is generated again in its plain form: %s", e.kernel, e)
            else:
                refused.add(e.kernel)
                log.warning("smelt: %s runs in Triton instead of Halide: %s", e.kernel, e)
            if not planned:  # a cache hit: the graph as traced, to be planned as it was then
                plan()
            regenerated = generate_graph(gm, kind, cfg, halide_refused=frozenset(refused),
                                         halide_plain=frozenset(plain), clock=clock)
            regenerated.output_strides, regenerated.padded_saved = generated.output_strides, generated.padded_saved
            graph_cache.replace(generated, regenerated, cfg)
            generated = regenerated
    compiled.kind = kind
    compiled.padded_saved = generated.padded_saved
    if folded is not None:
        compiled.call = folded.wrap(compiled.call)
        compiled.folded_weights = folded
    compiled.stage_seconds = dict(clock.seconds)
    log.debug("smelt: %s graph compiled in %s", kind, ", ".join(f"{k} {v:.3f} s" for k, v in clock.seconds.items()))
    observe.record(compiled)
    return compiled


def _has_plain_form(source: str) -> bool:
    """Whether a Halide kernel's source holds what its plain form leaves out (codegen/halide/kernel.py)."""
    return "_per_column" in source or f"{ROW_DOMAIN} = " in source or f"{PIECE_DOMAIN}0 = " in source


def _count_waited_builds(compiled: CompiledGraph, seconds: float) -> None:
    """A graph's first call waited `seconds` for its kernels' builds: part of its `load` stage."""
    compiled.stage_seconds["load"] = compiled.stage_seconds.get("load", 0.0) + seconds
    compile_stages.totals["load"] += seconds


def _compile_subgraphs_read_back(gm: torch.fx.GraphModule, generated: GeneratedGraph) -> None:
    """A graph read from the cache names its subgraphs (torch.cond's branches) without them: each is
    compiled again, for the example values it was compiled for (from the cache in turn)."""
    values = {n.name: n.meta.get("val") for n in gm.graph.nodes}
    for name, source in generated.subgraph_sources.items():
        if name not in generated.objects:
            examples = [values[operand] for operand in source["operands"]]
            generated.objects[name] = compile_graph(getattr(gm, source["module"]), examples, name)


def targets_for(cfg):
    """A function from a device type to the Target its backend under `cfg` compiles for."""
    known: dict[str, Target] = {}  # asked once per node by the layout passes and the lowering

    def target_for(device_type: str) -> Target:
        if device_type not in known:
            try:
                target = backends.for_device(cfg, torch.device(device_type)).target(device_type)
            except ValueError:  # a device no backend takes (meta)
                target = H100
            known[device_type] = _as_set(cfg, target)
        return known[device_type]
    return target_for


def _as_set(cfg, target: Target) -> Target:
    """The target with the fields a setting decides outright (not "auto") set as it says."""
    if cfg.row_value_tiles != "auto":
        target = dataclasses.replace(target, rows_for_row_values=cfg.row_value_tiles == "on")
    return target


def _wants(cfg, setting: str, target_field: str):
    """Whether a layout pass applies on a device: setting `setting` ("auto": the Target's field)."""
    target_for, value = targets_for(cfg), getattr(cfg, setting)
    return lambda device: switched_on(value, target_for(device.type), target_field)


def _wants_padded_products(cfg):
    """Whether a product of (device, dtype) gets aligned rows: "on" any; "auto" where the Target pads
    and the product runs on tensor cores. Without TF32, cuBLAS runs float32 products on CUDA cores,
    where aligned rows bought nothing: BERT's float32 head 3,767 us unpadded against 3,753 over a
    weight already padded, and padding it each call raised the call's peak by the weight's copy
    (1.15x eager's; RESULTS, thirty-third session)."""
    wants = _wants(cfg, "matmul_padding", "pads_matmul_rows")
    if cfg.matmul_padding != "auto":
        return lambda device, dtype: wants(device)
    return lambda device, dtype: wants(device) and (dtype != torch.float32 or torch.get_float32_matmul_precision() != "highest")


def _report_output_strides(strides: list) -> None:
    """Tell AOTAutograd the strides the forward returns, so the backward is compiled for them."""
    context = torch._guards.TracingContext.try_get()
    if context is not None and context.output_strides is not None:
        context.output_strides.extend(strides)


def generate_graph(gm: torch.fx.GraphModule, kind: str, cfg, halide_refused=frozenset(), halide_plain=frozenset(),
                   clock: StageClock | None = None) -> GeneratedGraph:
    """`halide_refused`: names of kernels Halide did not compile before, generated in Triton instead;
    `halide_plain`: kernels it refused once, generated again in a plainer form."""
    clock = clock or StageClock()
    graph_id = next(_graph_ids)
    with clock.stage("lower"):
        if cfg.gemm_epilogues:
            fuse_gemm_epilogues(gm)
        graph = lower_graph(gm, cfg, targets_for(cfg), compile_graph)
    with clock.stage("schedule"):
        sched, ctx = _schedule(graph, cfg, halide_refused, halide_plain, kind)
    with clock.stage("codegen"):
        return _generate(gm, kind, cfg, graph, sched, ctx, graph_id)


def _backend_of(cfg, step) -> backends.Backend:
    return backends.for_device(cfg, backends.step_device(step))


def _schedule(graph, cfg, halide_refused, halide_plain=frozenset(), kind: str = "inference"):
    """Fusion as the scheduler made it, then finishers and shared launches as the backends allow."""
    sched = make_schedule(graph)
    outputs = {o.name for o in graph.outputs if o.name is not None}
    if cfg.memory_order:
        sched.steps = order_for_memory(sched.steps, outputs, graph)
    ctx = backends.GraphContext(graph, cfg, sched.steps, frozenset(halide_refused), frozenset(halide_plain))

    def backend_of(step) -> backends.Backend:
        return _backend_of(cfg, step)

    def finishes(step) -> bool:
        return backend_of(step).finishes_reductions(step, ctx)

    # A reduction whose last program can finish the small reductions of its results after it takes
    # them into its launch. Such a pair stays out of shared launches, unless alike pairs (a split
    # norm per tensor) fill two: fewer launches than one per pair.
    sizes = buffer_sizes(graph)
    finishing = finisher_plan(sched.steps, finishes, sizes, cfg.finish_limit)
    lone = {id(big) for big in finishing.values() if not backend_of(big).alike(big, ctx)}
    paired = lone | {small for small, big in finishing.items() if id(big) in lone}

    def key_of(step):
        return None if id(step) in paired else backend_of(step).launch_key(step, ctx)

    if cfg.combo_kernels:
        sched.steps = combine(sched.steps, key_of, outputs, graph, merge=is_merge_key)
    sched.steps = ctx.steps = attach_finishers(sched.steps, finishes, sizes, cfg.finish_limit)
    # A tuned kernel's trials run on copies of arguments sharing memory (launcher._apart).
    sched.reuses = plan_reuse(sched.steps, outputs, graph)
    if cfg.cpu_workspace:
        sched.workspace = plan_workspace(sched.steps, sched.reuses, graph, inference=kind == "inference")
    if cfg.buffer_pool:
        placed = set(sched.workspace.offsets) if sched.workspace is not None else set()
        sched.pool = plan_pool(sched.steps, sched.reuses, graph, placed)
    return sched, ctx


def _generate(gm, kind: str, cfg, graph, sched, ctx, graph_id: int) -> GeneratedGraph:
    """Each kernel's source from its backend, then the wrapper that runs them."""
    # Each kernel runs on its own members' device: a graph may copy between devices.
    kernels, records = {}, {}
    for k, step in enumerate(sched.steps):
        if step.is_extern:
            continue
        backend, index = _backend_of(cfg, step), len(kernels)
        try:
            kernels[k] = backend.generate(step, ctx, index)
        except backends.KernelUnsupported as e:
            # A kernel its backend cannot print (or whose compiler refused it) runs in the fallback.
            fallback = backends.fallback()
            where = "'s interpreter" if fallback.interprets(backends.step_device(step).type) else ""
            log.warning("smelt: kernel %d runs in %s%s instead of %s: %s", index, fallback.name.capitalize(), where,
                        backend.name.capitalize(), e)
            backend = fallback
            kernels[k] = backend.generate(step, ctx, index)
        records[k] = backend.record(kernels[k], step, ctx, index)

    title = f"graph {graph_id} ({kind})"
    wrapper_source = WrapperCodegen(graph, sched, kernels, title).generate()
    objects = {name: constant.value for name, constant in graph.constants.items()}
    objects.update(graph.subgraphs)
    generated = GeneratedGraph(kind=kind, title=title, wrapper_source=wrapper_source,
                               fallback_ops=list(graph.fallback_ops), objects=objects, kernels=list(records.values()),
                               subgraph_sources=dict(graph.subgraph_sources))
    if cfg.debug_dir:
        files = {"aten_graph.txt": gm.print_readable(print_output=False), "ir.txt": graph.describe(),
                 "fused_groups.txt": sched.describe(), "wrapper.py": wrapper_source}
        files.update({f"{k.name}.py": k.source for k in kernels.values()})
        files.update({f"{r.cuda_twin.name}.cuda.py": r.cuda_twin.source for r in records.values() if r.cuda_twin})
        folder = dump_graph(cfg.debug_dir, kind, files)
        log.info("smelt: %s dumped to %s", title, folder)
    return generated
