"""Each smelt kernel's time inside a CPU model's call (issue 23): the wrapper's kernel launches
timed where they run, after the ATen calls before them, against the same kernel on the same
tensors alone, which shows what the model's context costs a kernel (page faults on fresh
buffers, threads still busy after oneDNN).

    SMELT_CPU_WORKSPACE=0|1 python -m benchmarks.probes.cpu_kernel_times mobilenetv3 [--calls 20] [--top 6]
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

import smelt.observe
from benchmarks.cpu_models import build


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args(argv)
    model, inputs = build(args.model)
    smelt.observe.reset()
    compiled = torch.compile(model, backend="smelt")
    with torch.no_grad():
        compiled(*inputs)
    spent = collections.Counter()
    last_args = {}
    for graph in smelt.observe.compiled_graphs():
        namespace = graph.call.__globals__
        for name in graph.kernel_names:
            launch = namespace[name]

            def timed(*a, name=name, launch=launch):
                start = time.perf_counter()
                launch(*a)
                spent[name] += time.perf_counter() - start
                last_args[name] = (launch, a)
            namespace[name] = timed
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)
        spent.clear()
        start = time.perf_counter()
        for _ in range(args.calls):
            compiled(*inputs)
        call_ms = (time.perf_counter() - start) / args.calls * 1e3
    kernels_ms = sum(spent.values()) / args.calls * 1e3
    print(f"{args.model}: {call_ms:.2f} ms a call, smelt's kernels {kernels_ms:.2f} ms of it ({len(spent)} kernels)")
    print("| kernel | us in the call | us alone, same tensors |")
    print("| --- | --- | --- |")
    for name, seconds in spent.most_common(args.top):
        launch, a = last_args[name]
        for _ in range(3):
            launch(*a)
        start = time.perf_counter()
        for _ in range(args.calls):
            launch(*a)
        alone = (time.perf_counter() - start) / args.calls * 1e6
        print(f"| {name} | {seconds / args.calls * 1e6:.1f} | {alone:.1f} |")


if __name__ == "__main__":
    main()
