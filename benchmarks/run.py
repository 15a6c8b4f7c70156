"""Time eager, Inductor and smelt on every workload and print a markdown table (last, on stdout).

    python3 -m benchmarks.run [--only softmax,layer_norm] [--no-compile-time] [--json PATH]
    python3 -m benchmarks.run --device cpu --small --only softmax   # harness check without a GPU

Progress and error details go to stderr, so stdout holds only the results block.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback

import torch

from benchmarks import compile_time
from benchmarks.backends import compile_fn
from benchmarks.measure import bench_ms, copy_bandwidth, synchronize
from benchmarks.workloads import Workload, by_name

COMPILED = ("inductor", "smelt")
# Timing rounds per backend on a CPU, where other processes share the cores.
CPU_ROUNDS = 7


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _short(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _innermost(exc: BaseException) -> BaseException:
    # Dynamo wraps a backend's exception (BackendCompilerFailed); the innermost names the problem.
    while True:
        inner = exc.__cause__ or getattr(exc, "inner_exception", None)
        if inner is None or inner is exc:
            return exc
        exc = inner


def _reason(exc: BaseException) -> str:
    exc = _innermost(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return _short(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def _log_exception(what: str, exc: BaseException) -> None:
    log(f"{what}:\n" + "".join(traceback.format_exception(_innermost(exc))[-30:]))


def _mismatch(exc: AssertionError) -> str:
    text = str(exc)
    count = re.search(r"Mismatched elements: (\d+) / (\d+)", text)
    diff = re.search(r"Greatest absolute difference: (\S+)", text)
    if count and diff:
        return f"{count[1]}/{count[2]} elements differ, max abs diff {diff[1]}"
    return _short(text.strip().splitlines()[0] if text.strip() else "mismatch")


def prepare_backend(backend: str, w: Workload, inputs, expected, device: str):
    """(the compiled callable, {}) once its output matches eager's; (None, {'error': 'ERROR (...)' |
    'FAIL (...)'}) otherwise."""
    try:
        compiled = compile_fn(backend, w.fn)
        out = compiled(*inputs)
        synchronize(device)
    except Exception as exc:
        _log_exception(f"[{w.name}] {backend} raised", exc)
        return None, {"error": f"ERROR ({_reason(exc)})"}
    try:
        if w.compare is not None:
            w.compare(out, expected)
        else:
            torch.testing.assert_close(out, expected, **w.tolerance)
    except AssertionError as exc:
        log(f"[{w.name}] {backend} output differs from eager:\n{exc}")
        return None, {"error": f"FAIL ({_mismatch(exc)})"}  # a wrong answer's time means nothing
    return compiled, {}


def time_backends(w: Workload, callables: dict, inputs, device: str, row: dict) -> None:
    """Times every callable in turn, `rounds` times over (on a shared CPU, a slow spell then falls
    on every backend alike), and keeps each one's median."""
    rounds = 1 if device.startswith("cuda") else CPU_ROUNDS
    samples: dict[str, list[float]] = {name: [] for name in callables}
    for _ in range(rounds):
        for name, fn in callables.items():
            if name not in samples:
                continue
            try:
                samples[name].append(bench_ms(lambda: fn(*inputs), device))
            except Exception as exc:
                _log_exception(f"[{w.name}] {name} raised while timing", exc)
                row[name] = {"error": f"ERROR ({_reason(exc)})"}
                del samples[name]
    for name, times in samples.items():
        row[name] = {"ms": statistics.median(times)}


def run_workload(w: Workload, args, copy_bw: float, deadline: float | None, row: dict) -> None:
    """Fills `row` in place, so a run stopped halfway still reports what it measured."""
    inputs = w.make_inputs(args.device, args.small)
    row.update(desc=w.describe(args.small), bytes=w.bytes_moved(inputs))
    expected = w.fn(*inputs)
    callables = {"eager": w.fn}
    for backend in args.backends:
        compiled, row[backend] = prepare_backend(backend, w, inputs, expected, args.device)
        if compiled is not None:
            callables[backend] = compiled
    time_backends(w, callables, inputs, args.device, row)
    for backend in ["eager", *args.backends]:
        log(f"[{w.name}] {backend} {row[backend]}")
        if backend != "eager" and "ms" in row[backend] and row["bytes"]:
            row[backend]["copy_bw_share"] = row["bytes"] / (row[backend]["ms"] * 1e-3) / copy_bw
    del inputs, expected, callables
    torch._dynamo.reset()
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()

    row["compile"] = {}
    timed = not args.no_compile_time and (args.compile_rows is None or w.name in args.compile_rows)
    for backend in args.backends if timed else ():
        left = None if deadline is None else deadline - time.monotonic()
        if "ERROR" in row[backend].get("error", ""):
            row["compile"][backend] = ("—", "—")  # it did not compile in-process either
        elif left is not None and left < 60:
            row["compile"][backend] = ("skipped (time)", "skipped (time)")
        else:
            timeout = 180.0 if left is None else min(180.0, (left - 20) / 2)
            row["compile"][backend] = compile_time.cold_and_warm(
                backend, w.name, args.device, args.small, timeout
            )
        log(f"[{w.name}] {backend} compile cold/warm s: {row['compile'][backend]}")
    if timed and "smelt" in args.backends and isinstance(row["compile"].get("smelt", (None,))[0], float):
        # Dynamo's own capture, in a second process like the warm runs: the part no backend's cache saves.
        row["compile"]["dynamo"] = compile_time.cold_and_warm("dynamo", w.name, args.device, args.small, 180.0)
        log(f"[{w.name}] dynamo alone s: {row['compile']['dynamo']}")


def _ms(result: dict | None) -> str:
    if result is None:
        return "—"
    return f"{result['ms']:.4g}" if "ms" in result else result["error"]


def _ratio(num: dict | None, den: dict | None) -> str:
    return f"{num['ms'] / den['ms']:.2f}x" if num and den and "ms" in num and "ms" in den else "—"


def _share(result: dict | None) -> str:
    return f"{100 * result['copy_bw_share']:.0f}%" if result and "copy_bw_share" in result else "—"


def _seconds(value) -> str:
    if not isinstance(value, float):
        return str(value)
    return f"{value:.3f}" if value < 1 else f"{value:.1f}"  # warm compiles are judged against 0.1 s


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


COLUMNS = [
    "workload", "shape/dtype", "eager ms", "inductor ms", "smelt ms",
    "smelt/eager speedup", "smelt/inductor speedup", "smelt % of copy BW", "inductor % of copy BW",
    "compile cold s (inductor/smelt)", "compile warm s (inductor/smelt)", "Dynamo alone s",
]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        comp = r.get("compile", {})
        na = ("—", "—")
        cold = f"{_seconds(comp.get('inductor', na)[0])} / {_seconds(comp.get('smelt', na)[0])}"
        warm = f"{_seconds(comp.get('inductor', na)[1])} / {_seconds(comp.get('smelt', na)[1])}"
        dynamo = _seconds(comp.get("dynamo", na)[1])
        eager, inductor, smelt = r.get("eager"), r.get("inductor"), r.get("smelt")
        desc = ": ".join(filter(None, [r.get("desc"), r.get("error")])) or "—"
        cells = [
            r["name"], desc, _ms(eager), _ms(inductor), _ms(smelt),
            _ratio(eager, smelt), _ratio(inductor, smelt), _share(smelt), _share(inductor), cold, warm, dynamo,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def geomean_line(rows: list[dict]) -> str:
    ratios = [
        r["inductor"]["ms"] / r["smelt"]["ms"]
        for r in rows
        if "ms" in r.get("inductor", {}) and "ms" in r.get("smelt", {})
    ]
    if not ratios:
        return "Geometric mean smelt/inductor speedup: n/a (no workload ran correctly on both)"
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return f"Geometric mean smelt/inductor speedup: {g:.2f}x over {len(ratios)} workload(s)"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(device: str) -> dict:
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        # smelt's code generator on this device, and its version.
        codegen = f"triton {_version('triton')}"
    else:
        name = f"{os.cpu_count()}-core CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        backend = os.environ.get("SMELT_CPU_BACKEND", "triton")
        codegen = f"halide {_version('halide')}" if backend == "halide" else f"SMELT_CPU_BACKEND={backend}"
    # The GPU machine gets a copy of the work tree without .git: the caller may name the commit.
    commit = os.environ.get("SMELT_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except Exception:
            commit = ""
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "device": name,
        "torch": torch.__version__,
        "codegen": codegen,
        "commit": commit or "unknown",
    }


def header(env: dict, copy_bw: float, args) -> str:
    lines = [
        f"### {env['date']} — {env['device']} — torch {env['torch']} — {env['codegen']} — commit {env['commit']}",
        "",
        f"Copy bandwidth ({'device-to-device' if args.device.startswith('cuda') else 'memory'}, read + write): {copy_bw / 1e9:.0f} GB/s."
        + (" Shapes: --small." if args.small else ""),
    ]
    if args.note:
        lines.append(args.note)
    return "\n".join(lines)


class _Stop(Exception):
    pass


def _on_sigterm(signum, frame):
    # `timeout` in scripts/gpu_check sends SIGTERM; stop and still print the rows we have.
    raise _Stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated workload names")
    parser.add_argument("--no-compile-time", action="store_true", help="skip the compile-time subprocesses")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny shapes, for checking the harness on a CPU")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    parser.add_argument("--markdown", metavar="PATH", help="also write the results block here")
    parser.add_argument("--note", help="a line printed under the header (e.g. test results)")
    parser.add_argument("--compile-rows", metavar="NAMES",
                        help="measure compile time only for these workloads (comma-separated); default: all")
    parser.add_argument("--backends", default=",".join(COMPILED),
                        help="compiled backends to time (eager always runs): e.g. smelt, to compare smelt settings")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads for every backend (torch's intra-op pool and Halide's); default: all cores")
    parser.add_argument("--time-budget", type=float, metavar="S",
                        help="skip compile-time runs that would end past S seconds from start")
    args = parser.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.compile_rows = None if args.compile_rows is None else set(args.compile_rows.split(","))
    unknown = set(args.backends) - set(COMPILED)
    if unknown:
        parser.error(f"unknown backend(s) {sorted(unknown)}; choose from {list(COMPILED)}")

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("CUDA is not available; use --device cpu --small to check the harness here.")
        return 2
    deadline = None if args.time_budget is None else time.monotonic() + args.time_budget
    if args.threads:
        torch.set_num_threads(args.threads)  # eager's and Inductor's OpenMP pool
        os.environ["HL_NUM_THREADS"] = str(args.threads)  # read when Halide's pool starts
    # Compilers print warnings on fd 1 (Halide: "(b)float16 type operation is emulated"): send
    # them to stderr with the progress lines, so stdout holds only the results block.
    results_out = os.dup(1)
    os.dup2(2, 1)
    signal.signal(signal.SIGTERM, _on_sigterm)

    workloads = by_name(args.only, args.device)
    env = environment(args.device)
    rows: list[dict] = []
    copy_bw = float("nan")
    try:
        copy_bw = copy_bandwidth(args.device, (1 << 30) if args.device.startswith("cuda") else (64 << 20))
        log(f"copy bandwidth {copy_bw / 1e9:.1f} GB/s")
        for w in workloads:
            rows.append({"name": w.name})
            try:
                run_workload(w, args, copy_bw, deadline, rows[-1])
            except (_Stop, KeyboardInterrupt):
                raise
            except Exception as exc:  # e.g. out of memory in eager: keep the other rows
                _log_exception(f"[{w.name}] failed", exc)
                rows[-1]["error"] = f"ERROR ({_reason(exc)})"
    except (_Stop, KeyboardInterrupt):
        log("stopped early; printing what was measured so far")
        done = {r["name"] for r in rows}
        rows += [{"name": w.name, "error": "not run (stopped)"} for w in workloads if w.name not in done]

    block = "\n".join([header(env, copy_bw, args), "", table(rows), "", geomean_line(rows)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "copy_bw_bytes_per_s": copy_bw, "small": args.small, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(block + "\n")
    sys.stdout.flush()
    os.dup2(results_out, 1)
    print(block, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
