"""Block sizes of a finisher: the small reduction a split kernel's last program runs
(scheduler/finishers.py, finisher.py).

A kernel alone picks blocks for many programs at once; a finisher is one program, which walks its
blocks one after another, each a round trip to L2. So it takes the widest tile of at most
FINISH_TILE elements: a column sum's [16, 1024] partials in one step rather than the 16 that the
standalone kernel's 64 columns a block take.
"""
from __future__ import annotations

import dataclasses

from ...artifact import BlockConfig
from ...symbolic import next_power_of_2, static_int
from .kernel import choose_blocks

# Elements of one finisher step, held in the one program's registers (64 a thread at the split
# kernel's 8 warps), whose count is the whole kernel's. None: the standalone kernel's blocks.
# Measured on the H100 (benchmarks/probes/column_sums.py, whole kernel, us): an RMS norm's weight
# gradient [4096, 1024] 35.0 / 25.3 / 23.8 / 22.8 at None / 4096 / 8192 / 16384 (Inductor 23.0), a
# layer norm's weight and bias [4096, 768] 39.3 / 35.3 / 24.1 / 21.8 (Inductor 25.1).
FINISH_TILE: int | None = 16384


def finisher_blocks(plan, interpret: bool, persistent_limit: int) -> BlockConfig:
    config = choose_blocks(plan, interpret, persistent_limit)
    xn = static_int(plan.xnumel)
    if FINISH_TILE is None or not config.persistent or xn is None or config.row_split > 1:
        return config
    xblock = max(config.XBLOCK, min(next_power_of_2(xn), FINISH_TILE // config.RBLOCK))
    return dataclasses.replace(config, XBLOCK=xblock)
