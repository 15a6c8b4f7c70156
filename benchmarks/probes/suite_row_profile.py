"""Where a model suite row's time goes, in the suite's own process (issue 22): the row is run as
`python -m smelt.tools.model_suite --timings` runs it (its accuracy check, then eager, Inductor and
smelt kept alive and timed in turns), and after the turns each compiled backend's calls are
profiled there: cProfile's functions by own time over 20 calls, and torch.profiler's GPU kernels
of one call (count and summed time), so that a row whose smelt figure differs from other
processes' (EfficientNet-B0's 4.4-5.6 ms in the suite, 2.4 in `setting_walls`) says whether its
host or its GPU is slower, and where.

    SMELT_GRAPH_CACHE=0 python -m benchmarks.probes.suite_row_profile efficientnet [--mode infer_bf16] \\
        [--no-check] [--lines 18]

--no-check leaves the accuracy check out (measure_case alone).
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import statistics
import time

import torch

from smelt.tools.model_suite import timing
from smelt.tools.model_suite.runner import run_case
from smelt.tools.model_suite.timing import measure_case
from smelt.tools.model_suite.zoo import all_specs


def gpu_kernels(fn) -> tuple[int, float, str]:
    """Kernels one call launches, their summed GPU ms, and the CUDA runtime calls other than launches
    with the GPU's copies (a blocking copy or a free makes the host wait for the GPU every call,
    which cProfile does not show as Python time)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    runtime = collections.Counter()
    for e in prof.events():
        name = e.name
        if e.device_type == torch.autograd.DeviceType.CUDA and not name.startswith(("Memcpy", "Memset")):
            continue
        if e.device_type != torch.autograd.DeviceType.CUDA and not name.startswith(("cuda", "cu")):
            continue
        if "LaunchKernel" in name or name.startswith(("cudaGetDevice", "cudaDeviceSynchronize")):
            continue
        runtime[name] += 1
    other = ", ".join(f"{n} x{c}" for n, c in runtime.most_common(12)) or "none"
    return len(events), sum(e.device_time for e in events) / 1e3, other


def idle_calls(fn, device, calls: int = 15) -> str:
    """Host ms of a call started on an idle GPU (returning before its kernels end, unless the call
    waits for the GPU inside) and the call's ms to the GPU's end, medians."""
    host, total = [], []
    for _ in range(calls):
        timing._sync(device)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        timing._sync(device)
        host.append((t1 - t0) * 1e3)
        total.append((time.perf_counter() - t0) * 1e3)
    return f"idle calls: host {statistics.median(host):.3f} ms, to the GPU's end {statistics.median(total):.3f} ms"


def profiled_rounds(lines: int):
    plain = timing._rounds

    def rounds(steady, device, cpu_calls, result):
        plain(steady, device, cpu_calls, result)
        for name, fn in steady.items():
            turns = " ".join(f"{t:.2f}" for t in result["ms_turns"][name])
            kernels = ""
            if torch.device(device).type == "cuda":
                count, gpu_ms, other = gpu_kernels(fn)
                kernels = (f"; one call's GPU kernels: {count}, {gpu_ms:.3f} ms; other CUDA calls: {other}; "
                           f"{idle_calls(fn, device)}")
            print(f"== {name}: turns {turns}{kernels}", flush=True)
            if name == "eager":
                continue
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(20):
                fn()
            timing._sync(device)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(lines)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--lines", type=int, default=18)
    args = parser.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # as the suite's CLI
    timing._rounds = profiled_rounds(args.lines)
    spec = all_specs()[args.model]
    device, size = ("cuda", "real") if torch.cuda.is_available() else ("cpu", "tiny")
    if args.no_check:
        result = measure_case(spec, args.mode, size, device)
    else:
        result = run_case(spec, args.mode, size, device, timings=True).timings
    print({k: round(v, 3) for k, v in (result or {}).get("ms", {}).items()})


if __name__ == "__main__":
    main()
