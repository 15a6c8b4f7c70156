"""One launch for a reduction and the small reduction of its results: the last program finishes.

A split reduction (a global sum) or a reduction of per-row results (`x.sum(1).amax()`) runs as
a big kernel whose programs each store partial results, then a small kernel that reduces them.
The second launch leaves the GPU idle for a few microseconds, and the small kernel runs on one
SM. Here the big kernel does both: each program stores its partials and takes a ticket from a
counter; the program that takes the last ticket knows that every partial is stored (the counter's
acquire-release order makes the other programs' stores visible to it), runs the small kernel's
code itself, reading the partials through L2, and zeroes the counter for the next launch.

No program waits for another, so unlike the row split's barrier this needs no guarantee about
which programs are resident. Which steps pair up is the scheduler's choice (scheduler/finishers.py): only where the small
kernel's work fits one program, and never a row split kernel, which has its own sync buffer.
"""
from __future__ import annotations

from ...symbolic import static_int
from ..common import IndentedBuffer

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

