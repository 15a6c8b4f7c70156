"""The Triton backend: what the pipeline asks of it (codegen/backends.py). Every device smelt runs
on, CPU tensors through Triton's interpreter; small kernels share launches as combo kernels, and
a reduction's last program can finish small reductions of its results."""
from __future__ import annotations

import logging

from ...artifact import BlockConfig, CudaTwin, GeneratedKernel
from ...errors import SmeltError
from ...scheduler.finishers import written_in_launch
from ...target import H100, Target
from ..backends import GraphContext, step_device
from .candidates import candidates, row_candidates
from .combo import ComboBodies, ComboKernelSource, combo_kernel
from .finisher_blocks import finisher_blocks
from .finisher import Finisher
from .kernel import TritonKernel, TritonKernelSource, choose_blocks, index_dtype_for, kernel_name, masks_needed
from .launch_guess import launch_guess
from .row_split import row_split_for

log = logging.getLogger("smelt")


class TritonBackend:
    name = "triton"
    devices = frozenset({"cpu", "cuda"})
    def interprets(self, device_type: str) -> bool:
        return device_type == "cpu"

    def target(self, device_type: str) -> Target:
        return H100  # the interpreter runs the kernels the GPU would: the same IR is tested

    def finishes_reductions(self, step, ctx: GraphContext) -> bool:
        # A row split's programs already meet through a sync buffer of their own. Interpreted
        # kernels never split rows, so asking as for the GPU covers both.
        return not step.is_extern and row_split_for(step.plan, False, ctx.cfg.persistent_reduction_limit) == 1

    def _bodies(self, ctx: GraphContext) -> ComboBodies:
        cfg = ctx.cfg
        return ctx.remember("triton.combo_bodies", lambda: ComboBodies(
            ctx.graph, lambda step: self.interprets(step_device(step).type), cfg.eviction_hints,
            cfg.persistent_reduction_limit, ctx.steps))

    def launch_key(self, step, ctx: GraphContext):
        return self._bodies(ctx).key(step)

    def alike(self, step, ctx: GraphContext) -> bool:
        return self._bodies(ctx).alike(step)

    def generate(self, step, ctx: GraphContext, index: int):
        interpret = self.interprets(step_device(step).type)
        if step.combo:
            return combo_kernel(step, self._bodies(ctx), ctx.graph, interpret, index, ctx.cfg.autotune)
        return generate_kernel(step, ctx.graph, interpret, ctx.cfg, index)

    def record(self, kernel, step, ctx: GraphContext, index: int) -> GeneratedKernel:
        interpret = self.interprets(step_device(step).type)
        twin = None
        if interpret and ctx.cfg.check_cuda_compile:  # SMELT_CHECK_CUDA_COMPILE: the kernel's CUDA form
            twin = _cuda_twin(step, kernel, ctx.graph, ctx.cfg, index, ctx.steps)
        if isinstance(kernel, ComboKernelSource):
            return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins),
                                   config=kernel.config, candidates=tuple(kernel.candidates), workspace=None,
                                   xnumel_arg=-1, interpret=interpret, combo=kernel.launch, cuda_twin=twin,
                                   backend=self.name)
        guess = launch_guess(kernel, ctx.graph) if not interpret or twin is not None else None
        return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins),
                               config=kernel.config, candidates=tuple(kernel.candidates), workspace=kernel.workspace,
                               ticket=kernel.ticket, xnumel_arg=len(kernel.params) + len(kernel.size_args),
                               interpret=interpret, cuda_twin=twin, backend=self.name, launch_guess=guess)


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


def tunable(step) -> bool:
    """Whether launching the kernel again leaves the same result: no input written in place,
    no scatter accumulating into its target."""
    return all(n.write_name == n.name and not n.is_scatter for n in step.group.nodes)


def _plan_and_blocks(step, interpret: bool, cfg):
    plan = step.plan
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
    configs = [config]
    if tunable(step) and not step.finishers:
        if cfg.autotune:
            configs = candidates(plan, config)
        elif cfg.tune_rows and not interpret:
            configs = row_candidates(plan, config)
    name = kernel_name(plan, config, index)
    finisher, stages = None, []
    for k, small in enumerate(step.finishers):
        small_plan = small.plan
        small_config = finisher_blocks(small_plan, interpret, cfg.persistent_reduction_limit)
        ready = written_in_launch([step, *step.finishers[:k]])
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


BACKEND = TritonBackend()
