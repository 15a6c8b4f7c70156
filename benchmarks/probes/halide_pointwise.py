"""A Halide pointwise kernel alone against ATen's (issue 23): smelt's compiled `a * b` kernel called
directly on preallocated tensors, against torch.mul(out=), at a few sizes, with torch's threads
(Halide's loops run on them: runtime/halide_threads.py). Medians of 300 calls, us.

    python -m benchmarks.probes.halide_pointwise
"""
from __future__ import annotations

import statistics
import time

import torch

import smelt


def _median_us(fn, calls: int = 300) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    print(f"threads {torch.get_num_threads()}")
    for numel in (16, 4096, 65536, 352256, 4 << 20):
        torch._dynamo.reset()
        smelt.observe.reset()
        a, b, out = torch.randn(numel), torch.randn(numel), torch.empty(numel)
        compiled = torch.compile(lambda a, b: a * b, backend="smelt")
        for _ in range(3):
            compiled(a, b)
        graph = smelt.observe.compiled_graphs()[-1]
        kernel = graph.call.__globals__[graph.kernel_names[0]]
        print(f"{numel:9d} elements: smelt's kernel alone {_median_us(lambda: kernel(a, b, out, numel)):8.1f} us, "
              f"torch.mul(out=) {_median_us(lambda: torch.mul(a, b, out=out)):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
