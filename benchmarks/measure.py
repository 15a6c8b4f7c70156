"""Timers and the copy-bandwidth yardstick.

On CUDA, times come from `triton.testing.do_bench` (CUDA events, L2 flushed between calls).
Elsewhere a wall-clock median stands in; it only exists so the harness can be checked on a CPU.
"""
from __future__ import annotations

import inspect
import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _do_bench_median(fn: Callable[[], Any], warmup: int, rep: int) -> float:
    from triton.testing import do_bench

    params = inspect.signature(do_bench).parameters
    if "return_mode" in params:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    # Older Triton: no return_mode, but quantiles=[0.5] gives the median.
    result = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])
    return float(result[0] if isinstance(result, (list, tuple)) else result)


def bench_ms(fn: Callable[[], Any], device: str, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds per call of `fn`; `warmup` and `rep` are in milliseconds, as in do_bench."""
    if device.startswith("cuda"):
        return _do_bench_median(fn, warmup, rep)
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    # Size the loop like do_bench does: enough calls to fill the time budget, at least a few.
    for _ in range(max(1, int(warmup * 1e-3 / once))):
        fn()
    times = []
    for _ in range(max(5, int(rep * 1e-3 / once))):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write.

    This is the practical ceiling for a memory-bound kernel, so it is measured on the machine at
    hand rather than taken from the data sheet.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device)
    del src, dst
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)


def median_call_ms(fn: Callable[..., Any], args, calls: int, warmup: int = 5) -> float:
    """Median wall-clock milliseconds of `calls` calls of fn(*args) after `warmup` (a CPU's numbers)."""
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3
