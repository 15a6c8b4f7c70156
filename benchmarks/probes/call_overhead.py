"""Host time per call of a compiled workload, for each backend, measured in short bursts that never
fill the GPU's launch queue (so the host is never waiting on the device), then a cProfile of
smelt's calls sorted by own time.

    python3 -m benchmarks.probes.call_overhead [transformer_block ...]

When a workload's host time per call approaches its GPU time, do_bench measures the host: this
says how far each backend is from that.
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch
from triton.testing import do_bench

from benchmarks.backends import compile_fn
from benchmarks.workloads import by_name

BURST = 8


def host_us_per_call(f, inputs) -> float:
    times = []
    for _ in range(40):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(BURST):
            f(*inputs)
        times.append((time.perf_counter() - start) / BURST * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    names = sys.argv[1:] or ["transformer_block"]
    for name in names:
        (w,) = by_name(name)
        inputs = w.make_inputs("cuda")
        for backend in ("inductor", "smelt"):
            f = compile_fn(backend, w.fn)
            for _ in range(3):
                f(*inputs)
            host = host_us_per_call(f, inputs)
            gpu = do_bench(lambda: f(*inputs), return_mode="median") * 1e3
            print(f"{name:18s} {backend:9s} host {host:7.1f} us/call   do_bench {gpu:7.1f} us", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(50):
            f(*inputs)
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
