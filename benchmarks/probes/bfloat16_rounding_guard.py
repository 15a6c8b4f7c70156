"""What the NaN guard on Halide's float32 -> bfloat16 rounding costs (codegen/halide/kernel.py
`to_bfloat16`): chains of bfloat16 ops on the CPU, as smelt compiles them (the guard only where a value
may be a signaling NaN) and with `--guard-every-rounding` (the guard on every rounding).

    python -m benchmarks.probes.bfloat16_rounding_guard [--guard-every-rounding] [--size 2048]

Run it both ways, each in a fresh cache folder (SMELT_CACHE_DIR), and compare the medians (ms a call,
of 30)."""
from __future__ import annotations

import argparse

import torch

from benchmarks.measure import median_call_ms


def chain(x, y):  # a rounding after every op
    a = x * 1.1 + y
    b = a * a - 0.5 * y
    c = torch.sigmoid(b) * x
    d = c / (1.0 + a.abs())
    return d * 0.9 + b * 0.1


def gelu_times(x):
    return torch.nn.functional.gelu(x) * x


def cast_in(x):  # a float32 input rounded: guarded either way (it may be a signaling NaN)
    return x.to(torch.bfloat16)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guard-every-rounding", action="store_true")
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args(argv)
    import smelt  # noqa: F401  (registers the backend)
    if args.guard_every_rounding:
        from smelt.codegen.halide.kernel import HalideKernel
        HalideKernel.rounds_unguarded = lambda self, value: False
    torch.manual_seed(0)
    n = args.size
    x, y = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    cases = (("chain", chain, (x, y)), ("gelu(x) * x", gelu_times, (x,)), ("float32 -> bfloat16", cast_in,
                                                                          (torch.randn(2 * n, 2 * n),)))
    for name, fn, inputs in cases:
        print(f"{name}: {median_call_ms(torch.compile(fn, backend='smelt'), inputs, 30):.3f} ms")


if __name__ == "__main__":
    main()
