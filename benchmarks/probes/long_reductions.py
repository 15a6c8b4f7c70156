"""Float sums over long rows and columns on the GPU: the error against float64 of smelt, Inductor and
eager (static and unknown sizes, split or not), then smelt's time on reductions of unknown length.
Backs the RESULTS tables of 2026-11-27 on looped reductions.

    python -m benchmarks.probes.long_reductions [--label after]     # on the GPU machine
    PYTHONPATH=<an older tree>:. python -m benchmarks.probes.long_reductions --label before --times-only
"""
from __future__ import annotations

import argparse
import os

import torch

import smelt  # noqa: F401  (registers the backend)
from benchmarks.measure import bench_ms


def relative_error(actual, reference) -> str:
    actual = actual if isinstance(actual, tuple) else (actual,)
    reference = reference if isinstance(reference, tuple) else (reference,)
    return " ".join(f"{((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item():.1e}"
                    for a, r in zip(actual, reference))


def accuracy(device: str) -> None:
    randn = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    cases = [
        ("var_mean 64M", lambda x: torch.var_mean(x), randn(1 << 26)),
        ("sum 64M +3", lambda x: x.sum(), randn(1 << 26) + 3),
        ("sumsq 64M", lambda x: (x * x).sum(), randn(1 << 26)),
        ("var(0) 4Mx4", lambda x: torch.var(x, 0), randn(1 << 22, 4) + 3),
        ("sumsq(0) 4Mx4", lambda x: (x * x).sum(0), randn(1 << 22, 4)),
        ("var_mean(-1) 16x4M", lambda x: torch.var_mean(x, -1), randn(16, 1 << 22)),
    ]
    for split in ("1", "0"):
        os.environ["SMELT_SPLIT_REDUCTIONS"] = split
        for dynamic in (False, True):
            for name, fn, x in cases:
                reference = fn(x.double())
                torch._dynamo.reset()
                ours = torch.compile(fn, backend="smelt", dynamic=dynamic)(x)
                torch._dynamo.reset()
                inductor = torch.compile(fn, dynamic=dynamic)(x)
                print(f"split={split} dynamic={dynamic!s:5} {name:20} smelt {relative_error(ours, reference)}  "
                      f"inductor {relative_error(inductor, reference)}  eager {relative_error(fn(x), reference)}",
                      flush=True)


def times(device: str, label: str) -> None:
    os.environ["SMELT_GRAPH_CACHE"] = "0"
    randn = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    cases = [
        ("sum 64M", lambda x: x.sum(), randn(1 << 26)),
        ("sumsq 64M", lambda x: (x * x).sum(), randn(1 << 26)),
        ("var_mean 64M", lambda x: torch.var_mean(x), randn(1 << 26)),
        ("var_mean(-1) 64x1M", lambda x: torch.var_mean(x, -1), randn(64, 1 << 20)),
        ("sum(-1) 4096x16384", lambda x: x.sum(-1), randn(4096, 16384)),
        ("layer_norm 16384x8192", lambda x: torch.nn.functional.layer_norm(x, (8192,)), randn(16384, 8192)),
        ("sum(0) 1Mx64", lambda x: x.sum(0), randn(1 << 20, 64)),
    ]
    for name, fn, x in cases:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="smelt", dynamic=True)
        error = relative_error(compiled(x), fn(x.double()))
        print(f"{label:6} {name:24} {bench_ms(lambda: compiled(x), device) * 1e3:8.1f} us  error {error}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--label", default="smelt")
    parser.add_argument("--times-only", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if not args.times_only:
        accuracy(args.device)
    times(args.device, args.label)


if __name__ == "__main__":
    main()
