"""cProfile of 20 compiled Adam steps (benchmarks/optimizer_step.py's parameters), by own time:
what the host does per step once compiled.

    python3 scripts/step_profile.py [--backend smelt] [--for-loop]
"""
from __future__ import annotations

import cProfile
import os
import pstats
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.backends import compile_fn  # noqa: E402
from benchmarks.optimizer_step import make  # noqa: E402

backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "smelt"
params, opt = make("cuda", False, "--for-loop" not in sys.argv)
step = compile_fn(backend, opt.step)
for _ in range(3):
    step()
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(20):
    step()
torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(18)
