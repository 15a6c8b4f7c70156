"""Cold and warm first calls of model-suite cases (issue 24), each in a fresh process with brand-new
cache folders (smelt's, Inductor's, Triton's): smelt with SMELT_COMPILE_WORKERS at each value asked,
Inductor, and Dynamo alone (backend "eager": its trace, plus one eager call) as the floor a warm start
is judged against. smelt's rows also give its stages and the Triton compiles made in the compiling
process itself (0 when the workers compiled every kernel ahead).

    python -m benchmarks.probes.suite_cold_compile bert:infer_bf16 gpt2:train [--workers 16 1] [--device cuda] [--no-inductor]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time, torch
backend, name, mode, device = sys.argv[1:5]
compiles = [0.0, 0]
if backend == "smelt":
    import smelt
    from smelt.runtime import kernel_binaries
    compile_binary = kernel_binaries.compile_binary
    def timed(*a, **k):
        start = time.perf_counter()
        try:
            return compile_binary(*a, **k)
        finally:
            compiles[0] += time.perf_counter() - start
            compiles[1] += 1
    kernel_binaries.compile_binary = timed
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs
size = "real" if device == "cuda" else "tiny"
fn = case_callable(all_specs()[name], mode, size, device, 0, backend)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
sync()
start = time.perf_counter()
fn()
sync()
first = time.perf_counter() - start
stages = {}
if backend == "smelt":
    for g in smelt.observe.compiled_graphs():
        for k, v in g.stage_seconds.items():
            stages[k] = stages.get(k, 0.0) + v
print(json.dumps({"first_call": first, "stages": stages, "compile_s": compiles[0], "compiles": compiles[1]}))
"""


def _run(backend: str, case: str, device: str, env: dict, timeout: float) -> dict | str:
    name, mode = case.split(":")
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, backend, name, mode, device], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"over {timeout:.0f} s"
    if done.returncode != 0:
        return f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="MODEL:MODE of smelt.tools.model_suite")
    parser.add_argument("--workers", nargs="*", type=int, default=[os.cpu_count() or 1])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-inductor", action="store_true",
                        help="skip Inductor's cold call (minutes on training cases) when only smelt's warm start is asked")
    args = parser.parse_args(argv)
    print("| case | run | first call s | vs Inductor | smelt stages s | compiles in the main process (s) |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for case in args.cases:
        with tempfile.TemporaryDirectory() as root:
            def env(tag: str, workers: int | None = None) -> dict:
                folder = os.path.join(root, tag)
                out = {**os.environ, "SMELT_CACHE_DIR": folder, "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "ind"),
                       "TRITON_CACHE_DIR": os.path.join(folder, "triton"), "PYTHONPATH": os.getcwd()}
                if workers is not None:
                    out["SMELT_COMPILE_WORKERS"] = str(workers)
                return out
            # Each row printed as it is measured, so a time limit that ends the run keeps the rows before it.
            base = None
            if not args.no_inductor:
                inductor = _run("inductor", case, args.device, env("inductor"), args.timeout)
                base = inductor["first_call"] if isinstance(inductor, dict) else None
                _print_row(case, "Inductor, cold", inductor, base)
            for workers in args.workers:
                _print_row(case, f"smelt, {workers} workers, cold",
                           _run("smelt", case, args.device, env(f"w{workers}", workers), args.timeout), base)
            _print_row(case, f"smelt, {args.workers[0]} workers, warm",
                       _run("smelt", case, args.device, env(f"w{args.workers[0]}", args.workers[0]), args.timeout), base)
            _print_row(case, "Dynamo alone (backend eager)", _run("eager", case, args.device, env("eager"), args.timeout),
                       base)


def _print_row(case: str, label: str, r: dict | str, base: float | None) -> None:
    if isinstance(r, str):
        print(f"| {case} | {label} | {r} | | | |", flush=True)
        return
    ratio = f"{r['first_call'] / base:.2f}x" if base else "-"
    stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items() if v >= 0.005)
    main_compiles = f"{r['compiles']} ({r['compile_s']:.1f})" if label.startswith("smelt") else ""
    print(f"| {case} | {label} | {r['first_call']:.2f} | {ratio} | {stages} | {main_compiles} |", flush=True)

if __name__ == "__main__":
    main()
