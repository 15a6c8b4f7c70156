"""Which cache hint a looped reduction kernel's load gets.

A looped reduction streams its rows through the GPU's L2: left to the default policy, those lines
push out data that someone is about to read again. So a load the kernel will not repeat is marked
evict_first, and a load whose lines will be wanted again soon is marked evict_last:
- a load every row of the kernel reads (its index has no x: a norm's weight, a bias);
- a buffer that a later pass over r reads again (a looped softmax reads its row once for the
  max and sum, then again to write the output).
Only kernels over contiguous rows get hints: looped ones, and persistent ones that write one value
per row (a var_mean), never a row. Measured on an H100 (benchmarks/RESULTS.md, hints on against
off): cross entropy's looped row statistics 4% faster, var_mean's persistent two-pass 3% faster;
persistent kernels that write rows (softmax, add + RMSNorm) 1.5% slower and a column sum 3.6%
slower with them.
"""
from __future__ import annotations

import sympy

from ...scheduler.nodes import RINDEX, XINDEX
from ...scheduler.placement import IN_ROW_LOOP
from ...symbolic import static_int


class EvictionPolicy:
    def __init__(self, plan, persistent: bool, enabled: bool):
        self.enabled = enabled and plan.is_reduction and plan.tiling is None and plan.r_contiguous() \
            and (not persistent or not plan.stores_per_element())
        self.plan = plan
        # Buffers read from memory by each looped pass (phase) of the kernel.
        self.reads_in_phase: dict[int, set[str]] = {}
        for node in plan.nodes:
            if plan.placement[node.name] in IN_ROW_LOOP:
                self.reads_in_phase.setdefault(plan.phase[node.name], set()).update(node.read_names)

    def _read_again_later(self, buffer: str, phase: int) -> bool:
        return any(buffer in names for p, names in self.reads_in_phase.items() if p > phase)

    def for_load(self, buffer: str, index: sympy.Expr, rank: int, phase: int) -> str | None:
        """'evict_first', 'evict_last' or None for a load of `buffer` at `index` (of the given
        rank: 2 when it varies along r) made in pass `phase`."""
        if not self.enabled or rank < 2:
            return None
        symbols = index.free_symbols
        xnumel = static_int(self.plan.xnumel)
        if XINDEX not in symbols and RINDEX in symbols and xnumel != 1:
            return "evict_last"
        if self._read_again_later(buffer, phase):
            return "evict_last"
        return "evict_first"
