"""An NCHW tensor copied to channels-last on the CPU (a conv net's input at the graph's edge), eager
against smelt, median of 100 calls each in one process: the interleaving store of a few channels
(codegen/halide/schedule.py RowChunks).

    python -m benchmarks.probes.channels_last_copy [--shapes 4x3x224x224 4x16x112x112]
"""
from __future__ import annotations

import argparse
import time

import torch

import smelt  # noqa: F401  (registers the backend)


def _median_us(fn, x, calls: int = 100) -> float:
    fn(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["4x3x224x224", "8x3x224x224", "4x8x112x112", "4x16x112x112"])
    args = parser.parse_args(argv)
    for text in args.shapes:
        x = torch.randn(*map(int, text.split("x")))
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: x.contiguous(memory_format=torch.channels_last) * 1.0, backend="smelt")
        eager = _median_us(lambda x: x.contiguous(memory_format=torch.channels_last), x)
        print(f"{text}: smelt {_median_us(compiled, x):.0f} us, eager {eager:.0f} us", flush=True)


if __name__ == "__main__":
    main()
