"""float32 sin, cos, sinh and cosh on the CPU: smelt's (codegen/halide/special.py's *_float32 helpers),
eager's and Inductor's, their error against float64 over every exponent, and their speed (issue 23).

    python -m benchmarks.probes.cpu_trig [--elements 1048576] [--calls 30]

The error is in units of the float32 result's last place (ulp), over random mantissas times 2**e
for e in [-30, 127], both signs, plus 0, -0, infinities, NaN and the largest float.
"""
from __future__ import annotations

import argparse
import math

import torch

from benchmarks.measure import median_call_ms


def _ulps(got: torch.Tensor, exact: torch.Tensor) -> float:
    ulp = exact.float().abs().clamp_min(2.0 ** -126) * 2.0 ** -23
    return ((got.double() - exact).abs() / ulp).nan_to_num(0).max().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    import smelt  # noqa: F401
    torch.manual_seed(0)
    n = args.elements
    exponent = torch.randint(-30, 128, (n,)).float()
    wide = (torch.rand(n) + 1) * torch.pow(2.0, exponent) * torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
    wide[:6] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 3.4e38])
    both = lambda a: (torch.sin(a), torch.cos(a))  # noqa: E731
    smelt_both = torch.compile(both, backend="smelt")
    for label, x in (("every exponent", wide), ("randn * 100", torch.randn(n) * 100)):
        ours, eager = smelt_both(x), both(x)
        for k, op in enumerate(("sin", "cos")):
            exact = getattr(torch, op)(x.double())
            print(f"{label}, {op}: max error smelt {_ulps(ours[k], exact):.2f} ulp, eager {_ulps(eager[k], exact):.2f} ulp")
    product = lambda a: torch.sin(a) * torch.cos(a)  # noqa: E731
    x = torch.randn(n) * 100
    times = [median_call_ms(f, (x,), args.calls) * 1e3 for f in (product, torch.compile(product),
                                                           torch.compile(product, backend="smelt"))]
    print(f"sin(x) * cos(x) over {n} float32: eager {times[0]:.0f} us, Inductor {times[1]:.0f} us, smelt {times[2]:.0f} us")
    # sinh and cosh: exponents up to 7 (past 89.4 both overflow float32).
    moderate = (torch.rand(n) + 1) * torch.pow(2.0, torch.randint(-30, 8, (n,)).float()) * torch.where(
        torch.rand(n) < 0.5, -1.0, 1.0)
    inside = torch.rand(n) * 1.8 - 0.9
    for op in ("sinh", "cosh"):
        fn = getattr(torch, op)
        exact = fn(moderate.double())
        finite = exact.abs() < 3.4e38
        ours, eager = torch.compile(fn, backend="smelt")(moderate), fn(moderate)
        worst = [_ulps(v[finite], exact[finite]) for v in (ours, eager)]
        said = [f"{w:.2f} ulp" if w < 1e30 else "inf where the value is finite (overflow)" for w in worst]
        print(f"exponents -30..7, {op}: max error smelt {said[0]}, eager {said[1]}")
        plus_one = lambda a, fn=fn: fn(a) + 1  # noqa: E731
        times = [median_call_ms(f, (inside,), args.calls) * 1e3 for f in (plus_one, torch.compile(plus_one),
                                                                        torch.compile(plus_one, backend="smelt"))]
        print(f"{op}(x) + 1 over {n} float32 in (-0.9, 0.9): eager {times[0]:.0f} us, Inductor {times[1]:.0f} us, "
              f"smelt {times[2]:.0f} us")


if __name__ == "__main__":
    main()
