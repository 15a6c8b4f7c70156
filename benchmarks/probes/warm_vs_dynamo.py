"""A warm compile of each CPU model (issue 23: warm <= 1 s; issue 24: warm <= Dynamo's trace + 1 s)
against Dynamo's trace alone: the first call in a fresh process with backend="eager" (no compiler
at all) and with smelt reading caches an earlier process filled, each less one eager call.

    python -m benchmarks.probes.warm_vs_dynamo [--only llama,bert] [--repeats 2]

Processes alternate eager / smelt so that the machine's drift falls on both.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from benchmarks.cpu_models import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = r"""
import sys, time, torch
from benchmarks.cpu_models import build
import smelt  # noqa: F401  (in both: its import-time settings change Dynamo's own speed)
model, inputs = build(sys.argv[1])
with torch.no_grad():
    model(*inputs)
    start = time.perf_counter(); model(*inputs); eager = time.perf_counter() - start
    compiled = torch.compile(model, backend=sys.argv[2])
    start = time.perf_counter(); compiled(*inputs); first = time.perf_counter() - start
print(f"{first - eager:.3f}")
"""


def first_call_s(model: str, backend: str, cache: str) -> float:
    env = dict(os.environ, SMELT_CACHE_DIR=cache, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", CHILD, model, backend], env=env, capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return float(done.stdout.split()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(MODELS)
    print("| model | Dynamo's trace alone s (backend eager) | smelt warm s | smelt's own s |")
    print("| --- | --- | --- | --- |")
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            first_call_s(name, "smelt", cache)  # fills the caches
            eager, warm = [], []
            for _ in range(args.repeats):
                eager.append(first_call_s(name, "eager", cache))
                warm.append(first_call_s(name, "smelt", cache))
        dynamo, smelt_s = min(eager), min(warm)
        print(f"| {name} | {dynamo:.2f} | {smelt_s:.2f} | {smelt_s - dynamo:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
