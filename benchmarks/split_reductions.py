"""Reductions with few outputs over many elements, with and without split reductions.

`python3 -m benchmarks.split_reductions [--device cpu] [--targets 1024/16384,64/64]`: checks each
workload against eager (float64 reference), then prints the median time and the bandwidth reached
(input bytes over time) of eager, smelt unsplit (SMELT_SPLIT_REDUCTIONS=0) and smelt split, for each
pair of the device backend's Target numbers given: split_programs/row_split_programs
(smelt/target.py, lowering/split_reduction.py). --scale shrinks the workloads (a CPU's are 1/8).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from unittest import mock

import torch

from benchmarks.measure import bench_ms, copy_bandwidth

M = 1 << 20


def workloads(device, scale: int = 1):
    def randn(*shape, dtype=torch.float32):
        shape = (shape[0] // scale,) + shape[1:]
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
    os.environ["SMELT_GRAPH_CACHE"] = "0"  # the Target is patched below, not part of a cache key
    torch._dynamo.reset()
    return torch.compile(fn, backend="smelt")


def _with_target(device: str, programs: tuple[int, int] | None):
    """While the graph compiles, the device's backend reports these split numbers."""
    if programs is None:
        return contextlib.nullcontext()
    from smelt import config
    from smelt.codegen import backends

    cls = type(backends.for_device(config.current(), torch.device(device)))
    original = cls.target

    def target(self, device_type):
        return dataclasses.replace(original(self, device_type), split_programs=programs[0],
                                   row_split_programs=programs[1])
    return mock.patch.object(cls, "target", target)


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
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--targets", default="1024/16384",
                        help="split_programs/row_split_programs pairs to time, comma-separated")
    parser.add_argument("--scale", type=int, default=0, help="divide the workloads' first dimension (cpu: 8)")
    parser.add_argument("--only", default="", help="run only workloads whose name contains this")
    args = parser.parse_args(argv)
    import smelt  # noqa: F401

    device = args.device
    scale = args.scale or (1 if device == "cuda" else 8)
    peak = copy_bandwidth(device)
    print(f"copy bandwidth {peak / 1e9:.0f} GB/s on {torch.cuda.get_device_name() if device == 'cuda' else device}")
    targets = [tuple(int(n) for n in t.split("/")) for t in args.targets.split(",")]
    header = f"{'workload':26} {'eager':>14} {'unsplit':>14} " + " ".join(
        f"{'split@' + '/'.join(map(str, t)):>14}" for t in targets)
    rows = [header]
    for name, (fn, inputs) in workloads(device, scale).items():
        if args.only not in name:
            continue
        nbytes = sum(a.numel() * a.element_size() for a in inputs)
        cells = []
        variants = [("eager", None, None), ("unsplit", False, None)] + [(f"split@{t}", True, t) for t in targets]
        for label, split, target in variants:
            f = fn if split is None else _compiled(fn, split)
            with _with_target(device, target):
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
