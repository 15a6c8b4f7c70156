"""Max error of layer_norm against float64, eager and smelt, on rows of four kinds: N(0, 1), offset
by 100, scaled by 0.01 and offset by 1000, scaled by 1e-3. The figures behind Halide's one-walk
mean and variance (codegen/halide/reductions.py).

    SMELT_CPU_BACKEND=halide python3 -m benchmarks.probes.norm_accuracy [--size 2048]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import smelt  # noqa: F401  (registers the backend)

ROWS = [("N(0, 1)", 1.0, 0.0), ("offset 100", 1.0, 100.0), ("0.01 x, offset 1000", 0.01, 1000.0),
        ("1e-3 x", 1e-3, 0.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args()
    n = args.size

    def layer_norm(x, w, b):
        return F.layer_norm(x, (n,), w, b, 1e-5)
    compiled = torch.compile(layer_norm, backend="smelt")
    torch.manual_seed(0)
    print(f"| rows ({n}x{n}) | eager max error | smelt max error |\n|---|---|---|")
    for label, scale, offset in ROWS:
        x, w, b = torch.randn(n, n) * scale + offset, torch.randn(n), torch.randn(n)
        exact = layer_norm(x.double(), w.double(), b.double())
        errors = [float((f(x, w, b).double() - exact).abs().max()) for f in (layer_norm, compiled)]
        print(f"| {label} | {errors[0]:.2e} | {errors[1]:.2e} |")


if __name__ == "__main__":
    main()
