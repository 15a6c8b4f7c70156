"""Times a few CPU kernels compiled by smelt's Halide backend against eager, and their compile cost.

Run: SMELT_CPU_BACKEND=halide python -m benchmarks.probes.halide_timings [--cache DIR]
Each workload is compiled once (cold unless the cache dir already holds its kernels), then timed
as the median of repeated calls. Kernel compile seconds come from the launchers themselves.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

import torch

from benchmarks.measure import median_call_ms


def workloads():
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(1024)
    yield "add_gelu 4M", lambda a, b: torch.nn.functional.gelu(a + b), (torch.randn(4 << 20), torch.randn(4 << 20))
    yield "softmax 4096x1024", lambda a: torch.softmax(a, -1), (torch.randn(4096, 1024),)
    yield "layer_norm 4096x1024", lambda a: ln(a), (torch.randn(4096, 1024),)
    yield "row sum 4096x1024", lambda a: a.sum(-1), (torch.randn(4096, 1024),)
    yield "column sum 1024x4096", lambda a: a.sum(0), (torch.randn(1024, 4096),)
    yield "transpose add 2048x2048", lambda a, b: a.t() + b, (torch.randn(2048, 2048), torch.randn(2048, 2048))
    yield "bf16 mul_add 4M", lambda a, b: a * b + 1, (torch.randn(4 << 20, dtype=torch.bfloat16),
                                                      torch.randn(4 << 20, dtype=torch.bfloat16))


def main():
    import smelt  # noqa: F401
    from smelt.runtime.halide_launcher import HalideLauncher
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args()
    print(f"backend={os.environ.get('SMELT_CPU_BACKEND')} threads={torch.get_num_threads()}")
    print(f"{'workload':26} {'first call s':>12} {'kernel compile s':>16} {'eager ms':>9} {'smelt ms':>9} {'speedup':>8}")
    for name, fn, args in workloads():
        # Eager first, before Halide's thread pool exists for this workload's kernels: the two
        # pools (OpenMP's and Halide's) spin after their work and slow each other on 2 cores.
        with torch.no_grad():
            eager = median_call_ms(fn, args, options.repeat, warmup=1) / 1e3
        torch._dynamo.reset()
        before = {id(o) for o in gc.get_objects() if type(o) is HalideLauncher}
        compiled = torch.compile(fn, backend="smelt")
        start = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        first = time.perf_counter() - start
        launchers = [o for o in gc.get_objects() if type(o) is HalideLauncher and id(o) not in before]
        compile_seconds = sum(l.compile_seconds for l in launchers)
        with torch.no_grad():
            ours = median_call_ms(compiled, args, options.repeat, warmup=1) / 1e3
            torch.testing.assert_close(compiled(*args), fn(*args), atol=1e-2, rtol=1e-2)
        print(f"{name:26} {first:12.3f} {compile_seconds:16.3f} {eager * 1e3:9.3f} {ours * 1e3:9.3f} "
              f"{eager / ours:7.2f}x")


if __name__ == "__main__":
    main()
