"""Elementwise ops on the CPU, eager against smelt's compiled kernel (issue 23: Halide ops that call
the C library per element run at a fraction of eager's vectorized speed; the seventeenth session's
tanh was one). Median ms of repeated calls on one [4, 128, 3072] float32 tensor, after a check
against eager.

    python -m benchmarks.probes.cpu_unary_speed [--ops tanh,gelu_tanh,sin] [--calls 20] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

OPS = {
    "tanh": torch.tanh, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "gelu": F.gelu, "exp": torch.exp,
    "sigmoid": torch.sigmoid, "silu": F.silu, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
    "log": lambda t: torch.log(t.abs() + 0.1), "pow1.5": lambda t: t.abs() ** 1.5,
    "atan2": lambda t: torch.atan2(t, t + 1), "softmax": lambda t: t.softmax(-1),
}


def _ms(fn, x, calls: int) -> float:
    fn(x)
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="tanh,gelu_tanh,gelu,sin,exp")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import smelt  # noqa: F401  (registers the backend)
    torch._dynamo.config.recompile_limit = 64
    x = torch.randn(4, 128, 3072) * 2
    print("| op | eager ms | smelt ms | smelt vs eager |")
    print("| --- | --- | --- | --- |")
    for name in args.ops.split(","):
        fn = OPS[name]
        compiled = torch.compile(fn, backend="smelt")
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-5, rtol=1e-5)
        eager = statistics.median(_ms(fn, x, args.calls) for _ in range(args.rounds))
        ours = statistics.median(_ms(compiled, x, args.calls) for _ in range(args.rounds))
        print(f"| {name} | {eager:.2f} | {ours:.2f} | {eager / ours:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
