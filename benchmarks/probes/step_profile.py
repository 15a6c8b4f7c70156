"""cProfile of 20 compiled Adam steps (benchmarks/optimizer_step.py's parameters), by own time:
what the host does per step once compiled. With --kernels, the GPU's side instead: each kernel's
time per step, from torch.profiler.

    python3 -m benchmarks.probes.step_profile [--backend smelt] [--for-loop] [--clip] [--kernels]
"""
from __future__ import annotations

import cProfile
import pstats
import sys

import torch

from benchmarks.backends import compile_fn
from benchmarks.optimizer_step import make_step

backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "smelt"
params, eager_step = make_step("cuda", False, "--for-loop" not in sys.argv, 1.0 if "--clip" in sys.argv else None)
step = compile_fn(backend, eager_step)
for _ in range(3):
    step()
torch.cuda.synchronize()
if "--kernels" in sys.argv:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60))
    sys.exit(0)
profile = cProfile.Profile()
profile.enable()
for _ in range(20):
    step()
torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(18)
