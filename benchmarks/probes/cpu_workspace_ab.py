"""A CPU model compiled twice in one process, with the CPU workspace (scheduler/workspace.py) and
without, the two called alternately (issue 23): median ms of each. Both share glibc's state, which
narrows the gap against separate processes, but this machine's speed drifts too much between
processes to compare them.

    python -m benchmarks.probes.cpu_workspace_ab mobilenetv3 [resnet18 bert llama] [--calls 20]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import smelt
from benchmarks.cpu_models import build


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    for name in args.models:
        model, inputs = build(name)
        compiled = {}
        with torch.no_grad():
            for label, on in (("without", False), ("with", True)):
                with smelt.config.override(cpu_workspace=on):
                    compiled[label] = torch.compile(copy.deepcopy(model), backend="smelt")
                    compiled[label](*inputs)
            times = {label: [] for label in compiled}
            for _ in range(3):
                for fn in compiled.values():
                    fn(*inputs)
            for _ in range(args.calls):
                for label, fn in compiled.items():
                    start = time.perf_counter()
                    fn(*inputs)
                    times[label].append(time.perf_counter() - start)
        medians = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        print(f"{name}: without the workspace {medians['without']:.2f} ms, with it {medians['with']:.2f} ms "
              f"({medians['without'] / medians['with']:.2f}x)")


if __name__ == "__main__":
    main()
