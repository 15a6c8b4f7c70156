"""Where compile time goes: a cold process (brand-new cache dirs), then a warm one (same dirs), each
under cProfile.

    python3 -m benchmarks.probes.compile_profile [--workload softmax] [--backend smelt] [--lines 45]

Prints the functions with the most cumulative time during the first compiled call (imports and
the eager warm-up happen before the profile starts, as in benchmarks/compile_time.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import cProfile, pstats, sys, time, torch
from benchmarks.backends import compile_fn, preload
from benchmarks.workloads import by_name
(w,) = by_name(sys.argv[1])
inputs = w.make_inputs("cuda")
w.fn(*inputs); torch.cuda.synchronize()
preload(sys.argv[2])
compiled = compile_fn(sys.argv[2], w.fn)
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
compiled(*inputs); torch.cuda.synchronize()
profile.disable()
print(f"first compiled call: {time.perf_counter() - start:.3f} s (under cProfile)")
pstats.Stats(profile).sort_stats("cumulative").print_stats(int(sys.argv[3]))
"""

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="softmax")
    parser.add_argument("--backend", default="smelt")
    parser.add_argument("--lines", default="45")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, TRITON_CACHE_DIR=f"{root}/triton", TORCHINDUCTOR_CACHE_DIR=f"{root}/inductor",
                   SMELT_CACHE_DIR=f"{root}/smelt")
        for run in ("cold", "warm"):
            print(f"===== {run}", flush=True)
            subprocess.run([sys.executable, "-c", CHILD, args.workload, args.backend, args.lines], env=env,
                           check=False)
