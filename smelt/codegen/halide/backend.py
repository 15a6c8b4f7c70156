"""The Halide backend: what the pipeline asks of it (codegen/backends.py). CPU tensors, and CUDA
ones where SMELT_CUDA_BACKEND asks for it; tiny kernels of one size merge into one pipeline."""
from __future__ import annotations

import dataclasses
import logging

from ...artifact import GeneratedKernel
from ...errors import SmeltError
from ...target import CPU, H100, Target
from ...scheduler.combo import merge_key
from ..backends import GraphContext, KernelUnsupported, step_device
from .gpu_schedule import HalideGpuSchedule
from . import pieces as halide_pieces
from .kernel import HalideKernel, HalideKernelSource, halide_kernel_name
from .ops import UnsupportedInHalide
from .schedule import HalideSchedule, TransposeTiles

log = logging.getLogger("smelt")

# Halide's buffer extents and strides are int32.
MAX_STORAGE_ELEMENTS = 2 ** 31 - 1


class HalideBackend:
    name = "halide"
    devices = frozenset({"cpu", "cuda"})
    def interprets(self, device_type: str) -> bool:
        return False

    def target(self, device_type: str) -> Target:
        # (Halide's kernels read a host scalar input from memory, so its GPU graphs run those readers in ATen.)
        # (A depthwise backward's input gradient as GPU kernels was measured with Triton's only: cuDNN's here.)
        return dataclasses.replace(H100 if device_type == "cuda" else CPU, max_storage_elements=MAX_STORAGE_ELEMENTS,
                                   host_scalar_args=False, depthwise_backward_kernel_taps=0)

    def finishes_reductions(self, step, ctx: GraphContext) -> bool:
        return False

    def launch_key(self, step, ctx: GraphContext):
        return merge_key(step)

    def alike(self, step, ctx: GraphContext) -> bool:
        return False

    def generate(self, step, ctx: GraphContext, index: int) -> HalideKernelSource:
        kernel = generate_halide_kernel(step, ctx.graph, index, step_device(step).type == "cuda",
                                        plain=halide_kernel_name(step.plan, index) in ctx.plain)
        if kernel.name in ctx.refused:  # compile_graph warned of it
            raise KernelUnsupported(f"smelt: Halide's compiler refused {kernel.name} before")
        return kernel

    def record(self, kernel, step, ctx: GraphContext, index: int) -> GeneratedKernel:
        return GeneratedKernel(name=kernel.name, source=kernel.source, origins=tuple(kernel.origins), config=None,
                               candidates=(), workspace=None, backend=self.name, interpret=False,
                               xnumel_arg=len(kernel.params) + len(kernel.size_args))


def generate_halide_kernel(step, graph, index: int, gpu: bool = False, plain: bool = False) -> HalideKernelSource:
    plan = step.plan
    name = halide_kernel_name(plan, index)
    kernel = HalideKernel(plan, graph, HalideGpuSchedule if gpu else HalideSchedule, plain)
    origins = sorted({o for n in plan.nodes for o in n.buffer.origins})
    members = ", ".join(f"{n.name} ({plan.placement[n.name]})" for n in plan.nodes)
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# iterates {plan.xnumel} x {plan.rnumel}; members: {members}; stores: {', '.join(plan.stored) or '-'}"]
    try:
        source = kernel.source(name, comments)
        if halide_pieces.SPLIT_KERNELS and not plain:
            kernel, source = _in_pieces(kernel, source, name, comments)
    except SmeltError as e:
        # The kind is kept: an UnsupportedInHalide sends the kernel to Triton.
        kind = UnsupportedInHalide if isinstance(e, UnsupportedInHalide) else SmeltError
        raise kind(f"{e} (kernel {name}, from ATen ops: {', '.join(origins)})") from e
    params, sizes = kernel.launch_args()
    return HalideKernelSource(name=name, source=source, params=params, size_args=sizes, xnumel=plan.xnumel,
                              rnumel=plan.rnumel if plan.blocks_2d else None, origins=origins)


def _in_pieces(kernel: HalideKernel, source: str, name: str, comments: list[str]) -> tuple[HalideKernel, str]:
    """The kernel printed again a loop per piece (pieces.py) where its body asks for that and it spares
    masked loads; else the kernel as printed."""
    pieces = kernel.piecewise()
    if not pieces or (kernel.tiles is not None and not _tiles_give_way(kernel)):
        return kernel, source
    split = HalideKernel(kernel.plan, kernel.graph, type(kernel.schedule), pieces=pieces)
    try:
        split_source = split.source(name, comments)
    except UnsupportedInHalide as e:  # printed in one loop already: it stays so
        log.debug("smelt: %s stays in one loop: %s", name, e)
        return kernel, source
    if split.schedule.gathers >= kernel.schedule.gathers:
        return kernel, source
    log.debug("smelt: %s is printed a loop per piece (%d pieces): masked loads %d -> %d", name, len(pieces),
              kernel.schedule.gathers, split.schedule.gathers)
    return split, split_source


def _tiles_give_way(kernel: HalideKernel) -> bool:
    """Whether a kernel whose store walks its domain reordered goes to pieces (which have no tiles):
    one that transposes in tiles, from MIN_GATHERS_OVER_TILES masked loads (pieces.py). An interleaving
    store's row chunks stay: a cat of 4 pieces into a channels-last tensor of 4 channels ran slower in
    pieces (RESULTS, fifty-eighth session; test_halide_pieces holds the chunks)."""
    return (isinstance(kernel.tiles, TransposeTiles)
            and kernel.schedule.gathers >= halide_pieces.MIN_GATHERS_OVER_TILES)


BACKEND = HalideBackend()
