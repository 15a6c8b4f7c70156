"""What a fused kernel does, independent of the language it is printed in: the scheduler plans
each step once (Step.plan), and every backend prints from that plan.

A kernel iterates x (outputs) and, if it reduces, r (the reduced elements of each output). Its
members run in phases: a reduction's result exists only after a full pass over r, so a member
that needs it runs in the next pass. With the whole row in registers (a persistent reduction) the
passes are one straight line of code; otherwise each pass is its own loop over r.

A pointwise kernel may be tiled (see tiling.py): then x and r are two factors of its elements,
every member is placed "xr", and r is split across programs instead of looped over.
"""
from __future__ import annotations

import dataclasses

import sympy

from ..ir.ops import is_indirect
from ..symbolic import static_int
from .fusion import FusedGroup
from .nodes import RINDEX, SchedulerNode, XINDEX
from .placement import ROW_VALUED, Placement
from .tiling import Tiling, choose_tiling


@dataclasses.dataclass
class KernelPlan:
    group: FusedGroup
    stored: list[str]
    placement: dict[str, Placement]  # node name -> where its values live
    phase: dict[str, int]
    num_phases: int
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    tiling: Tiling | None = None
    # Buffers its kernel reads from the graph input that holds them (scheduler/schedule.py plan_memory).
    kept_in_input: dict = dataclasses.field(default_factory=dict)
    _r_contiguous: bool | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def blocks_2d(self) -> bool:
        """Whether the kernel works on [XBLOCK, RBLOCK] blocks (else on [XBLOCK])."""
        return self.is_reduction or self.tiling is not None

    @property
    def nodes(self) -> list[SchedulerNode]:
        return self.group.nodes

    @property
    def is_reduction(self) -> bool:
        return self.group.is_reduction

    @property
    def has_scan(self) -> bool:
        return any(n.is_scan for n in self.nodes)

    def writer_of(self, buffer: str) -> SchedulerNode | None:
        for n in self.nodes:
            if n.write_name == buffer:
                return n
        return None

    def members_of_phase(self, phase: int, placements: tuple[Placement, ...]) -> list[SchedulerNode]:
        return [n for n in self.nodes if self.phase[n.name] == phase and self.placement[n.name] in placements]

    def r_contiguous(self) -> bool:
        """Whether the main reads walk memory along r (rows) rather than along x (columns): the first
        read that depends on r steps by one element along it."""
        if self._r_contiguous is None:
            self._r_contiguous = self._first_r_read_walks_rows()
        return self._r_contiguous

    def _first_r_read_walks_rows(self) -> bool:
        for node in self.nodes:
            if self.placement[node.name] == Placement.X:
                continue
            for _, index in node.reads_in_kernel(self.placement[node.name], self.xnumel, self.rnumel):
                if RINDEX in index.free_symbols:
                    if index.coeff(RINDEX) == 1 or XINDEX not in index.free_symbols:
                        return True
                    return _steps_in_unit_runs(index, self.rnumel)
        return True

    def stores_per_element(self) -> bool:
        """Whether the kernel writes a value per (x, r) element, not only one per row."""
        return any(self.placement[n.name] in ROW_VALUED for n in self.nodes if n.write_name in self.stored)

    def static_sizes(self) -> tuple[int | None, int | None]:
        return static_int(self.xnumel), static_int(self.rnumel)


RUN_STEPS = 16


def _steps_in_unit_runs(index: sympy.Expr, rnumel: sympy.Expr) -> bool:
    """Whether an index with no plain rindex term (a row gathered from pieces, as Swin's patch merging
    concatenates four neighbours' channels) still reads its first RUN_STEPS elements of r one after
    another, at the first two x: such rows are read in runs, and a column plan would loop over them
    in 64 x 64 blocks (2-5x slower on the H200, benchmarks/probes/rows_in_runs.py)."""
    if index.free_symbols - {XINDEX, RINDEX}:
        return False
    steps = min(RUN_STEPS, (static_int(rnumel) or RUN_STEPS + 1) - 1)
    for x in (0, 1):
        at = [index.xreplace({XINDEX: x, RINDEX: r}) for r in range(steps + 1)]
        if any(not (b - a).is_Integer or b - a != 1 for a, b in zip(at, at[1:])):
            return False
    return steps > 0


def plan_kernel(group: FusedGroup, stored: list[str], kept_in_input: dict | None = None, target=None) -> KernelPlan:
    kept = dict(kept_in_input or {})
    tiling = choose_tiling(group, stored, target)
    if tiling is not None:
        placement = {n.name: Placement.XR for n in group.nodes}
        return KernelPlan(group, stored, placement, {n.name: 0 for n in group.nodes}, 1,
                          tiling.outer, tiling.inner, tiling, kept)
    placement = group.placements()
    writers = {n.write_name: n for n in group.nodes}
    phase: dict[str, int] = {}
    for node in group.nodes:
        p = 0
        for name in node.read_names:
            producer = writers.get(name)
            if producer is None or producer is node or producer.position > node.position:
                continue
            p = max(p, phase[producer.name] + (1 if placement[producer.name] == Placement.REDUCTION else 0))
        phase[node.name] = p
    num_phases = max(phase.values()) + 1
    return KernelPlan(group, stored, placement, phase, num_phases, group.xnumel, group.rnumel, kept_in_input=kept)


def kernel_sizes_symbols(plan: KernelPlan) -> list[sympy.Symbol]:
    """Size symbols the kernel's index math or bounds mention (passed to it as arguments)."""
    found = set(sympy.sympify(plan.xnumel).free_symbols) | set(sympy.sympify(plan.rnumel).free_symbols)
    for node in plan.nodes:
        for _, index in node.reads_in_kernel(plan.placement[node.name], plan.xnumel, plan.rnumel):
            found |= index.free_symbols
        found |= node.store_index(plan.placement[node.name], plan.xnumel, plan.rnumel).free_symbols
    found -= {XINDEX, RINDEX}
    return sorted((s for s in found if not is_indirect(s)), key=str)

