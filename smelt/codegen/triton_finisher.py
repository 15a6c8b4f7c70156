"""One launch for a reduction and the small reduction of its results: the last program finishes.

A split reduction (a global sum) or a reduction of per-row results (`x.sum(1).amax()`) runs as
a big kernel whose programs each store partial results, then a small kernel that reduces them. The second launch leaves the GPU idle for a few microseconds, and the small kernel runs on
one SM. Here the big kernel does both: each program stores its partials and takes a ticket from a
counter; the program that takes the last ticket knows that every partial is stored (the counter's
acquire-release order makes the other programs' stores visible to it), runs the small kernel's
code itself, reading the partials through L2, and zeroes the counter for the next launch.

No program waits for another, so unlike the row split's barrier this needs no guarantee about
which programs are resident. It is chosen only where the small kernel's work fits one program
(FINISH_LIMIT elements), and never for a row split kernel, which has its own sync buffer.
"""
from __future__ import annotations

import torch

from ..scheduler.schedule import Step
from ..symbolic import static_int
from .common import IndentedBuffer
from .simd import plan_kernel
from .triton_row_split import row_split_for

# Elements the finishing program reduces at most: a global sum's 16384 partials (lowering's
# ROW_TARGET_PROGRAMS) fit; a column sum's [16, 4096] partials do not, and stay a second kernel.
FINISH_LIMIT = 16384


def attach_finishers(steps: list[Step], persistent_limit: int) -> list[Step]:
    """The steps, each (reduction, small reduction of its results) pair made one step whose
    `finisher` is the small reduction."""
    merged: list[Step] = []
    for step in steps:
        before = merged[-1] if merged else None
        if before is not None and can_finish(before, step, persistent_limit):
            before.finisher = step
            before.frees = before.frees + step.frees
            continue
        merged.append(step)
    return merged


def can_finish(big: Step, small: Step, persistent_limit: int) -> bool:
    if big.is_extern or small.is_extern or big.finisher is not None:
        return False
    if not big.group.is_reduction or not small.group.is_reduction:
        return False
    if not small.group.read_names() - small.group.names <= set(big.stored):
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
    # Interpreted kernels never split rows, so asking as for the GPU covers both.
    return row_split_for(plan_kernel(big.group, big.stored), False, persistent_limit) == 1


class Finisher:
    """The small kernel's code as a function the big kernel's last program calls, once per x block."""

    PREFIX = "finish_"

    def __init__(self, kernel, name: str):
        self.kernel = kernel  # a TritonKernel generated with program_arg=True
        self.name = name
        self.function = kernel.function_source(name)
        self.params = [(self.PREFIX + p, buffer) for p, buffer in kernel.args.call_order()]

    @property
    def helpers(self) -> set[str]:
        return self.kernel.helpers

    @property
    def helper_sources(self) -> dict[str, str]:
        return self.kernel.helper_sources

    @property
    def sizes(self) -> list[str]:
        return self.kernel.args.sizes

    def epilogue(self, out: IndentedBuffer) -> None:
        k = self.kernel
        config = k.config
        blocks = -(-static_int(k.plan.xnumel) // config.XBLOCK)
        args = [p for p, _ in self.params] + list(self.sizes)
        args += [str(static_int(k.plan.xnumel)), str(static_int(k.plan.rnumel)), "pid", f"XBLOCK={config.XBLOCK}"]
        if k.plan.blocks_2d:
            args.append(f"RBLOCK={config.RBLOCK}")
        out.writeline("# The last program to arrive finds every partial stored and reduces them.")
        out.writeline("tl.debug_barrier()")  # every thread's stores come before the release
        out.writeline("ticket = tl.atomic_add(ticket_ptr, 1, sem='acq_rel')")
        out.writeline("if ticket == tl.num_programs(0) - 1:")
        out.writeline(f"    for pid in range(0, {blocks}):")
        out.writeline(f"        {self.name}({', '.join(args)})")
        out.writeline("    tl.store(ticket_ptr, 0)")


class TicketCounter:
    """The launcher's side: one int32 counter per device, zeroed once and kept zero by the kernel."""

    def __init__(self):
        self.counters: dict = {}

    def buffer(self, device) -> torch.Tensor:
        counter = self.counters.get(device)
        if counter is None:
            counter = self.counters[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return counter
