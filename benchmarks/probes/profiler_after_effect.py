"""Does a finished torch.profiler session slow the launches after it? Times one compiled step
(benchmarks/optimizer_step.py's clipped Adam) before and after one `launches_per_step`.

    TEARDOWN_CUPTI=0 python3 -m benchmarks.probes.profiler_after_effect eager   # torch 2.11's default
    python3 -m benchmarks.probes.profiler_after_effect smelt                    # TEARDOWN_CUPTI=1 unless set
"""
import os
import sys

os.environ.setdefault("TEARDOWN_CUPTI", "1")

import torch

from benchmarks.backends import compile_fn
from benchmarks.measure import bench_ms
from benchmarks.optimizer_step import host_ms_per_step, launches_per_step, make_step

backend = sys.argv[1] if len(sys.argv) > 1 else "smelt"
_, step = make_step("cuda", False, True, 1.0)
step = step if backend == "eager" else compile_fn(backend, step)
for _ in range(3):
    step()
torch.cuda.synchronize()
print(f"{backend}, TEARDOWN_CUPTI={os.environ['TEARDOWN_CUPTI']}")
print(f"before the profiler: {bench_ms(step, 'cuda'):.3f} ms, host {host_ms_per_step(step, 'cuda'):.3f} ms per step")
print(f"launches per step: {launches_per_step(step, 'cuda')}")
print(f"after the profiler:  {bench_ms(step, 'cuda'):.3f} ms, host {host_ms_per_step(step, 'cuda'):.3f} ms per step")
