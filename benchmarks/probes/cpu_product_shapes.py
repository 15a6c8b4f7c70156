"""The ATen products of one CPU model, smelt's against Inductor's, by shape (issue 23): both compiled in
one process, profiled in alternating rounds, each shape's self time a call.

    python -m benchmarks.probes.cpu_product_shapes llama [--rounds 3] [--calls 5]

A product of one shape slower under one compiler than the other points at what surrounds the call
(a fresh result's page faults, its inputs' layout), not at the library.
"""
from __future__ import annotations

import argparse
import collections

import torch

import smelt  # noqa: F401 - registers the backend
from benchmarks.cpu_models import build

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    model, inputs = build(args.model)
    compiled = {"inductor": torch.compile(model), "smelt": torch.compile(model, backend="smelt")}
    calls = args.rounds * args.calls
    us = {name: collections.Counter() for name in compiled}
    count = {name: collections.Counter() for name in compiled}
    with torch.no_grad():
        for fn in compiled.values():
            for _ in range(3):
                fn(*inputs)
        for _ in range(args.rounds):
            for name, fn in compiled.items():
                with torch.profiler.profile(record_shapes=True) as profile:
                    for _ in range(args.calls):
                        fn(*inputs)
                for event in profile.events():
                    if event.name in PRODUCTS:
                        key = (event.name, str(event.input_shapes[:2]))  # the operands (an out= adds a third)
                        us[name][key] += event.self_cpu_time_total / calls
                        count[name][key] += 1 / calls
    for name in compiled:
        print(f"== {name}: products {sum(us[name].values()):.0f} us a call")
        for key, total in sorted(us[name].items(), key=lambda item: -item[1]):
            print(f"  {total:8.1f} us  x{count[name][key]:.0f}  {key[0]} {key[1]}")


if __name__ == "__main__":
    main()
