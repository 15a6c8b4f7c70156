"""Where a compile's time goes, stage by stage: wall seconds of each of smelt's steps for one graph,
kept on its CompiledGraph (`stage_seconds`) and summed per process (`totals`).

Stages: `cache` (the graph's key and the lookup), `plan` (layouts, lowering/layout_plan.py),
`lower`, `schedule` (fusion, finishers, combos), `codegen` (kernel and wrapper sources), `load`
(compiling and loading the kernels: Halide's are compiled here; Triton's GPU kernels at their
first launch, which is not counted). Dynamo's trace and AOTAutograd are torch's, around all this.
A graph with subgraphs (torch.cond's branches) compiles them while it is lowered: their stages
count in its `lower` as well as on their own.
"""
from __future__ import annotations

import collections
import contextlib
import time

# Seconds per stage over every graph compiled in this process (a probe reads and clears it).
totals: collections.Counter = collections.Counter()


class StageClock:
    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.seconds[name] += spent
            totals[name] += spent

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        totals[name] += seconds
