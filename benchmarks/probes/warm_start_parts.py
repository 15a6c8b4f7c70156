"""A CPU model's warm first call, where it goes: Dynamo alone against smelt over one warm cache
folder, each in fresh processes, with the graph cache's lookup (reading the entry and assembling the
cached kernels' launchers) timed inside smelt's call (issue 23: warm first calls within 1 s); and
the same model saved by torch's precompile (`aot_compile` with smelt, smelt/precompile.py), loaded
and called, which skips Dynamo's trace.

    python -m benchmarks.probes.warm_start_parts [MODEL] [--rounds 3]

MODEL is one of benchmarks/cpu_models.py's (mobilenetv3 by default). The first smelt process fills
the cache folder and saves the precompiled function, and is not counted."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MARKER = "WARM_START_PARTS"


def _child(name: str, backend: str) -> None:
    import torch
    from benchmarks.backends import compile_fn, preload
    from benchmarks.cpu_models import inference
    import smelt.graph_cache.dynamo_level as dynamo_level

    lookup = []
    real = dynamo_level.DynamoCacheSlot.lookup

    def timed(self):
        start = time.perf_counter()
        try:
            return real(self)
        finally:
            lookup.append(time.perf_counter() - start)
    dynamo_level.DynamoCacheSlot.lookup = timed
    model, fn, inputs = inference(name)
    for _ in range(5):
        fn(*inputs)
    saved = os.path.join(os.environ["SMELT_CACHE_DIR"], "precompiled.bin")
    preload("smelt" if backend.startswith("precompile") else backend)
    if backend == "precompile-save":
        with torch.no_grad():
            torch.compile(model.forward, fullgraph=True, backend="smelt").aot_compile((inputs, {})) \
                .save_compiled_function(saved)
        return
    start = time.perf_counter()
    if backend == "precompile":
        with open(saved, "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        with torch.no_grad():
            loaded(model, *inputs)
    else:
        compile_fn(backend, fn)(*inputs)
    first = time.perf_counter() - start
    print(MARKER, json.dumps({"first_call_s": first, "lookup_s": sum(lookup)}), flush=True)


def _run(model: str, backend: str, cache: str) -> dict:
    env = dict(os.environ, SMELT_CACHE_DIR=cache, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-m", "benchmarks.probes.warm_start_parts", "--child", backend, model],
                         env=env, capture_output=True, text=True, check=True).stdout
    if backend == "precompile-save":
        return {}
    return json.loads(next(line for line in out.splitlines() if line.startswith(MARKER)).split(" ", 1)[1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="mobilenetv3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.model, args.child)
        return
    with tempfile.TemporaryDirectory(prefix="smelt_warm_parts_") as cache:
        _run(args.model, "smelt", cache)  # cold: fills the cache folder
        _run(args.model, "precompile-save", cache)
        print(f"{args.model}, warm first calls in fresh processes (s)\n"
              "| round | Dynamo alone | smelt | smelt's lookup | precompiled: load and first call | its lookup |")
        print("| --- | --- | --- | --- | --- | --- |")
        for k in range(args.rounds):
            dynamo, smelt = _run(args.model, "dynamo", cache), _run(args.model, "smelt", cache)
            loaded = _run(args.model, "precompile", cache)
            print(f"| {k + 1} | {dynamo['first_call_s']:.3f} | {smelt['first_call_s']:.3f} | {smelt['lookup_s']:.3f} "
                  f"| {loaded['first_call_s']:.3f} | {loaded['lookup_s']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
