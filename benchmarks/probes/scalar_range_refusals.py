"""Ops with a number past their tensors' dtype range, eager against smelt: where eager raises (or
computes) and smelt does not, a line. The sweep behind lowering/eager_refusals.py's number check
(RESULTS, 2026-12-08).

    python -m benchmarks.probes.scalar_range_refusals [--backend smelt]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

CASES = {
    "add_alpha": lambda x, v: x.add(x, alpha=v), "sub_alpha": lambda x, v: x.sub(x, alpha=v),
    "addcmul": lambda x, v: torch.addcmul(x, x, x, value=v), "addcdiv": lambda x, v: torch.addcdiv(x, x, x, value=v),
    "threshold": lambda x, v: F.threshold(x, 0.5, v), "hardtanh": lambda x, v: F.hardtanh(x, -abs(v), abs(v)),
    "nan_to_num": lambda x, v: torch.nan_to_num(x / 0, posinf=v), "elu": lambda x, v: F.elu(x, alpha=v),
    "leaky_relu": lambda x, v: F.leaky_relu(x, v), "softplus": lambda x, v: F.softplus(x, threshold=v),
    "celu": lambda x, v: F.celu(x, alpha=v), "hardshrink": lambda x, v: F.hardshrink(x, abs(v)),
    "softshrink": lambda x, v: F.softshrink(x, abs(v)), "where_self": lambda x, v: torch.where(x > 0, v, x),
    "where": lambda x, v: torch.where(x > 0, x, v), "masked_fill": lambda x, v: x.masked_fill(x > 0, v),
    "fill": lambda x, v: x.clone().fill_(v), "full_like": lambda x, v: torch.full_like(x, v) + x,
    "full": lambda x, v: torch.full((3,), v, dtype=x.dtype) + x, "new_full": lambda x, v: x.new_full((2,), v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([0, 2]), v), "clamp": lambda x, v: x.clamp(max=v),
    "clamp_min": lambda x, v: x.clamp_min(-v), "pad": lambda x, v: F.pad(x, (1, 1), value=v),
    "scatter": lambda x, v: x.scatter(0, torch.tensor([0, 2]), v), "mul": lambda x, v: x * v,
    "add": lambda x, v: x + v, "div": lambda x, v: x / v, "lerp": lambda x, v: torch.lerp(x, x * 2, v),
    "fmod": lambda x, v: torch.fmod(x, v), "remainder": lambda x, v: torch.remainder(x, v),
    "eq": lambda x, v: x == v, "maximum": lambda x, v: torch.maximum(x, torch.full_like(x, 1)),
    "rsub": lambda x, v: torch.rsub(x, x, alpha=v), "fill_diagonal": lambda x, v: x.view(1, 3).clone().fill_diagonal_(v),
}
VALUES = ((torch.float16, 70000.0), (torch.bfloat16, 1e39), (torch.float32, 1e39), (torch.int8, 1000),
          (torch.uint8, 300), (torch.int32, 2**40))


def _outcome(fn) -> str:
    try:
        return "value " + str(fn().tolist())
    except Exception as error:  # noqa: BLE001 (a refusal of any kind is an outcome)
        return "raises " + str(error).strip().splitlines()[0][:70]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="smelt")
    args = parser.parse_args()
    if args.backend == "smelt":
        import smelt  # noqa: F401
    differing = 0
    for dtype, number in VALUES:
        x = torch.tensor([1, -3, 100], dtype=dtype)
        for name, case in CASES.items():
            eager = _outcome(lambda: case(x, number))
            torch._dynamo.reset()
            compiled = _outcome(lambda: torch.compile(lambda t: case(t, number), backend=args.backend)(x))
            if eager.split()[0] != compiled.split()[0]:
                differing += 1
                print(f"{str(dtype):15} {name:14} eager {eager} | {args.backend} {compiled}")
    print(f"{len(CASES)} ops x {len(VALUES)} dtypes: {differing} differ (eager raises where {args.backend} "
          f"computes, or the reverse)")


if __name__ == "__main__":
    main()
