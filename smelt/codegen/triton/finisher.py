"""One launch for a reduction and the small reduction of its results: the last program finishes.

A split reduction (a global sum) or a reduction of per-row results (`x.sum(1).amax()`) runs as
a big kernel whose programs each store partial results, then a small kernel that reduces them.
The second launch leaves the GPU idle for a few microseconds, and the small kernel runs on one
SM. Here the big kernel does both: each program stores its partials and takes a ticket from a
counter; the program that takes the last ticket knows that every partial is stored (the counter's
acquire-release order makes the other programs' stores visible to it), runs the small kernel's
code itself, reading the partials through L2, and zeroes the counter for the next launch.

No program waits for another, so unlike the row split's barrier this needs no guarantee about
which programs are resident. It is chosen only where the small kernel's work fits one program
(FINISH_LIMIT elements), and never for a row split kernel, which has its own sync buffer.
"""
from __future__ import annotations

import torch

from ...scheduler.schedule import Step
from ...symbolic import static_int
from ..common import IndentedBuffer
from ..simd import plan_kernel
from .row_split import row_split_for

# Elements the finishing program reduces at most: a global sum's 16384 partials (lowering's
# ROW_TARGET_PROGRAMS) fit; a column sum's [16, 4096] partials do not, and stay a second kernel.
FINISH_LIMIT = 16384


def attach_finishers(steps: list[Step], persistent_limit: int, eligible=lambda step: True) -> list[Step]:
    """The steps, each reduction kernel followed by small reductions of its results made one step
    whose `finishers` are those small reductions (in order: a later one may read an earlier one's).
    Only steps `eligible` says are printed as Triton take part."""
    finishing = finisher_plan(steps, persistent_limit, eligible)
    merged: list[Step] = []
    for step in steps:
        big = finishing.get(id(step))
        if big is not None:  # the step just before it in `merged`
            big.finishers.append(step)
            big.frees = big.frees + step.frees
            continue
        merged.append(step)
    return merged


def finisher_plan(steps: list[Step], persistent_limit: int, eligible=lambda step: True) -> dict[int, Step]:
    """Which step each small reduction would finish in (id of the small step -> the big step), for
    the steps in this order; nothing is changed."""
    finishing: dict[int, Step] = {}
    finishers: dict[int, list[Step]] = {}  # big step's id -> the small steps it takes
    before = None
    for step in steps:
        if before is not None and not step.is_extern and not before.is_extern and eligible(before) \
                and can_finish(before, step, persistent_limit, finishers.get(id(before), [])):
            finishers.setdefault(id(before), []).append(step)
            finishing[id(step)] = before
            continue
        before = step
    return finishing


def can_finish(big: Step, small: Step, persistent_limit: int, finishers: list[Step] | None = None) -> bool:
    """Whether `small` can run in `big`'s last program, after the small steps `finishers` (by
    default big's own) already do."""
    finishers = big.finishers if finishers is None else finishers
    if big.is_extern or small.is_extern or small.finishers or big.combo or small.combo:
        return False
    if not big.group.is_reduction or not small.group.is_reduction:
        return False
    ready = set(big.stored).union(*(f.stored for f in finishers))
    if not small.group.read_names() - small.group.names <= ready:
        # Only a pure reduction of the big kernel's results. Measured on an H100: cross entropy's
        # loss over rows (a gather per row) finished by the last program took 0.248 ms, 0.236 with
        # the gather as the row kernel's epilogue, against 0.223 as a second kernel.
        return False
    nodes = big.group.nodes + small.group.nodes
    if any(n.is_scatter or n.is_scan or n.write_name != n.name for n in nodes):
        return False  # scans and in-place writes keep their own kernels
    if big.group.nodes[0].buffer.get_device() != small.group.nodes[0].buffer.get_device():
        return False
    xn, rn = static_int(small.group.xnumel), static_int(small.group.rnumel)
    if xn is None or rn is None or xn * rn > FINISH_LIMIT:
        return False
    if not static_int(big.group.xnumel):
        return False  # a launch of no programs would leave the small reduction unrun
    if finishers:
        return True  # the big kernel was already found fit for finishing
    # Interpreted kernels never split rows, so asking as for the GPU covers both.
    return row_split_for(plan_kernel(big.group, big.stored), False, persistent_limit) == 1


class Finisher:
    """The small kernels' code as functions the big kernel's last program calls, each once per x
    block, in order. `stages` are (TritonKernel generated with program_arg=True, function name)."""

    def __init__(self, stages: list):
        self.stages = []  # (kernel, function name, [(parameter in the big kernel, buffer)])
        self.function = ""  # the stages' @triton.jit functions
        for k, (kernel, name) in enumerate(stages):
            self.function += kernel.function_source(name)
            params = [(f"finish{k}_{p}", buffer) for p, buffer in kernel.args.call_order()]
            self.stages.append((kernel, name, params))

    @property
    def params(self) -> list[tuple[str, str]]:
        return [p for _, _, params in self.stages for p in params]

    @property
    def helpers(self) -> set[str]:
        return set().union(*(kernel.helpers for kernel, _, _ in self.stages))

    @property
    def helper_sources(self) -> dict[str, str]:
        found = {}
        for kernel, _, _ in self.stages:
            found.update(kernel.helper_sources)
        return found

    @property
    def sizes(self) -> list[str]:
        return list(dict.fromkeys(s for kernel, _, _ in self.stages for s in kernel.args.sizes))

    def epilogue(self, out: IndentedBuffer) -> None:
        out.writeline("# The last program to arrive finds every partial stored and reduces them.")
        out.writeline("tl.debug_barrier()")  # every thread's stores come before the release
        out.writeline("ticket = tl.atomic_add(ticket_ptr, 1, sem='acq_rel')")
        out.writeline("if ticket == tl.num_programs(0) - 1:")
        for k, (kernel, name, params) in enumerate(self.stages):
            config, plan = kernel.config, kernel.plan
            if k:
                out.writeline("    tl.debug_barrier()")  # the stage before stored what this one reads
            args = [p for p, _ in params] + list(kernel.args.sizes)
            args += [str(static_int(plan.xnumel)), str(static_int(plan.rnumel)), "pid", f"XBLOCK={config.XBLOCK}"]
            if plan.blocks_2d:
                args.append(f"RBLOCK={config.RBLOCK}")
            out.writeline(f"    for pid in range(0, {-(-static_int(plan.xnumel) // config.XBLOCK)}):")
            out.writeline(f"        {name}({', '.join(args)})")
        out.writeline("    tl.store(ticket_ptr, 0)")

