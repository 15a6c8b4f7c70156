"""Reductions with few outputs over many elements, with and without split reductions.

`python3 -m benchmarks.split_reductions [--targets 512,1024]` on a CUDA machine: checks each
workload against eager (float64 reference), then prints the median time and the bandwidth reached
(input bytes over time) of eager, smelt unsplit (SMELT_SPLIT_REDUCTIONS=0) and smelt split, for each
TARGET_PROGRAMS given (lowering/split_reduction.py).
"""
from __future__ import annotations

import argparse
import os

import torch

from benchmarks.measure import bench_ms, copy_bandwidth

M = 1 << 20


def workloads(device):
    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, dtype=dtype)
    return {
        "sum 64M": (lambda x: x.sum(), [randn(64 * M)]),
        "sum 50M+17": (lambda x: x.sum(), [randn(50 * M + 17)]),
        "abs().mean() 64M": (lambda x: x.abs().mean(), [randn(64 * M)]),
        "amax bf16 64M": (lambda x: x.amax(), [randn(64 * M, dtype=torch.bfloat16)]),
        "argmax 64M": (lambda x: x.argmax(), [randn(64 * M)]),
        "var_mean 64M": (lambda x: torch.var_mean(x), [randn(64 * M)]),
        "var_mean 50M+17": (lambda x: torch.var_mean(x), [randn(50 * M + 17)]),
        "sum(-1) 8x8M": (lambda x: x.sum(-1), [randn(8, 8 * M)]),
        "sum(0) 32768x4096": (lambda x: x.sum(0), [randn(32768, 4096)]),
        "sum(0) 4096x4096": (lambda x: x.sum(0), [randn(4096, 4096)]),
        "var_mean(0) 32768x4096": (lambda x: torch.var_mean(x, 0), [randn(32768, 4096)]),
        "sum(0) 65536x1000": (lambda x: x.sum(0), [randn(65536, 1000)]),
    }


def _compiled(fn, split: bool):
    os.environ["SMELT_SPLIT_REDUCTIONS"] = "1" if split else "0"
    torch._dynamo.reset()
    return torch.compile(fn, backend="smelt")


def _error(actual, args, fn) -> float:
    expected = fn(*[a.double() for a in args])
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    worst = 0.0
    for a, e in zip(actual, expected):
        if not e.dtype.is_floating_point:  # argmax: compare the values at the indices
            x = args[0].reshape(-1).double()
            a, e = x[a.reshape(-1)], x[e.reshape(-1)]
        a = a.double()
        worst = max(worst, float((a - e).norm() / e.norm().clamp_min(1e-30)))
    return worst


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="1024", help="TARGET_PROGRAMS values to time, comma-separated")
    parser.add_argument("--only", default="", help="run only workloads whose name contains this")
    args = parser.parse_args(argv)
    import smelt  # noqa: F401
    from smelt.lowering import split_reduction

    device = "cuda"
    peak = copy_bandwidth(device)
    print(f"copy bandwidth {peak / 1e9:.0f} GB/s on {torch.cuda.get_device_name()}")
    targets = [int(t) for t in args.targets.split(",")]
    header = f"{'workload':26} {'eager':>14} {'unsplit':>14} " + " ".join(f"{'split@' + str(t):>14}" for t in targets)
    rows = [header]
    for name, (fn, inputs) in workloads(device).items():
        if args.only not in name:
            continue
        nbytes = sum(a.numel() * a.element_size() for a in inputs)
        cells = []
        variants = [("eager", None, None), ("unsplit", False, None)] + [(f"split@{t}", True, t) for t in targets]
        for label, split, target in variants:
            if target is not None:
                split_reduction.TARGET_PROGRAMS = target
                split_reduction.SPLIT_BELOW_PROGRAMS = target // 2
            f = fn if split is None else _compiled(fn, split)
            error = _error(f(*inputs), inputs, fn)  # the first call compiles, under this setting
            if error > 1e-3:
                raise AssertionError(f"{name} {label}: relative error {error:.2e}")
            ms = bench_ms(lambda f=f, inputs=inputs: f(*inputs), device)
            cells.append(f"{ms * 1e3:7.0f}us {nbytes / (ms * 1e-3) / 1e9:4.0f}G")
        rows.append(f"{name:26} " + " ".join(f"{c:>14}" for c in cells))
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
