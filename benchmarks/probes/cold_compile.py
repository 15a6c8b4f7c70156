"""The first call of a CPU model in a fresh process with an empty cache folder, once per
SMELT_COMPILE_WORKERS value, with smelt's stages summed over its graphs (`load` is building and
loading the kernels). Each run is its own process.

    python -m benchmarks.probes.cold_compile [resnet18 mobilenetv3 ...] [--workers 1 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, torch, smelt
from benchmarks.cpu_models import build
torch.manual_seed(0)
model, inputs = build(sys.argv[1])
f = torch.compile(model, backend="smelt")
start = time.perf_counter()
with torch.no_grad():
    f(*inputs)
stages = {}
for g in smelt.observe.compiled_graphs():
    for k, v in g.stage_seconds.items():
        stages[k] = stages.get(k, 0.0) + v
print(json.dumps({"first_call": time.perf_counter() - start, "stages": stages}))
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet18", "mobilenetv3"])
    parser.add_argument("--workers", nargs="*", type=int, default=[1, 2])
    args = parser.parse_args(argv)
    print("| model | SMELT_COMPILE_WORKERS | first call s | load s |\n| --- | --- | --- | --- |")
    for name in args.models:
        for workers in args.workers:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "SMELT_CACHE_DIR": cache, "SMELT_COMPILE_WORKERS": str(workers),
                       "PYTHONPATH": os.getcwd()}
                done = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(f"| {name} | {workers} | failed: {done.stderr.strip().splitlines()[-1:]} | |")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {name} | {workers} | {result['first_call']:.2f} | {result['stages'].get('load', 0.0):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
