"""Compile time of one backend on one workload, measured in a fresh process.

Child (`python3 -m benchmarks.compile_time --backend smelt --workload softmax`): times the first
compiled call, synchronized, minus one eager call, and prints `COMPILE_TIME_S <seconds>` last.

Parent (`cold_and_warm`): runs the child twice with the same brand-new cache dirs. The first run is
cold; the second is warm, with every cache a backend keeps on disk left on (Inductor's FX graph
cache included), since that is what a user who compiles the same model twice sees.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MARKER = "COMPILE_TIME_S"
STAGES_MARKER = "SMELT_STAGES"  # smelt's seconds per compile stage (smelt/compile_stages.py), as JSON
# Not a row of benchmarks/workloads.py: benchmarks/optimizer_step.py's Adam step (issue 6).
ADAM_STEP = "adam_step"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, choices=["inductor", "smelt", "dynamo"])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.backends import compile_fn, preload
    from benchmarks.measure import synchronize
    from benchmarks.workloads import by_name

    if args.workload.startswith("model:"):  # benchmarks/cpu_models.py's models, inference
        from benchmarks.cpu_models import inference
        _, fn, inputs = inference(args.workload.split(":", 1)[1])
    elif args.workload == ADAM_STEP:
        from benchmarks.optimizer_step import make
        _, optimizer = make(args.device, args.small, True)
        fn, inputs = optimizer.step, ()
    else:
        (workload,) = by_name(args.workload, args.device)
        fn, inputs = workload.fn, workload.make_inputs(args.device, args.small)
    # Eager runs first so CUDA context creation and library loading land outside both timings.
    eager_times = []
    for _ in range(5):
        synchronize(args.device)
        start = time.perf_counter()
        fn(*inputs)
        synchronize(args.device)
        eager_times.append(time.perf_counter() - start)
    preload(args.backend)

    compiled = compile_fn(args.backend, fn)
    synchronize(args.device)
    start = time.perf_counter()
    compiled(*inputs)
    synchronize(args.device)
    first = time.perf_counter() - start
    if args.backend == "smelt":
        from smelt import compile_stages
        print(f"{STAGES_MARKER} {json.dumps(dict(compile_stages.totals))}", flush=True)
    print(f"{MARKER} {first - statistics.median(eager_times):.6f}", flush=True)


def run_once(backend: str, workload: str, device: str, small: bool, cache_root: str, timeout: float) -> float:
    """Seconds reported by one child process; raises RuntimeError with a short reason on failure."""
    return run_once_with_stages(backend, workload, device, small, cache_root, timeout)[0]


def run_once_with_stages(backend: str, workload: str, device: str, small: bool, cache_root: str,
                         timeout: float) -> tuple[float, dict]:
    """(seconds, smelt's seconds per stage: empty for another backend) of one child process."""
    env = dict(os.environ)
    env.update(
        TRITON_CACHE_DIR=os.path.join(cache_root, "triton"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_root, "inductor"),
        SMELT_CACHE_DIR=os.path.join(cache_root, "smelt"),
        PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p),
    )
    cmd = [sys.executable, "-m", "benchmarks.compile_time", "--backend", backend, "--workload", workload]
    cmd += ["--device", device] + (["--small"] if small else [])
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timeout after {timeout:.0f}s") from None
    stages = {}
    for line in proc.stdout.splitlines():
        if line.startswith(STAGES_MARKER):
            stages = json.loads(line.split(" ", 1)[1])
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return float(line.split()[1]), stages
    tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1].strip()
    raise RuntimeError(tail if len(tail) <= 60 else tail[:59] + "…")


def cold_and_warm(backend: str, workload: str, device: str, small: bool, timeout: float = 180.0):
    """(cold, warm) seconds; each is a float or an error string."""
    results = []
    with tempfile.TemporaryDirectory(prefix=f"smelt_bench_{backend}_") as cache_root:
        for _ in ("cold", "warm"):
            if results and isinstance(results[0], str):
                results.append("—")  # a failed cold run leaves nothing warm to measure
                continue
            try:
                results.append(run_once(backend, workload, device, small, cache_root, timeout))
            except RuntimeError as exc:
                results.append(f"ERROR ({exc})")
    return tuple(results)


if __name__ == "__main__":
    _child()
