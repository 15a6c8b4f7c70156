"""A CPU model compiled once per value of one smelt setting in one process, the compiled functions
called alternately (issue 23): median ms of each. They share glibc's and the threads' state, which
narrows a gap against separate processes, but this machine's speed drifts too much between
processes to compare them.

    python -m benchmarks.probes.cpu_setting_ab mobilenetv3 [resnet18 bert llama] --setting cpu_workspace=0,1
    python -m benchmarks.probes.cpu_setting_ab resnet18 --setting channels_last=off,on [--calls 20]

A setting is a smelt.config field and its values as its SMELT_* variable takes them.
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
    parser.add_argument("--setting", required=True, help="field=value,value[,...]")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    field, _, values = args.setting.partition("=")
    values = values.split(",")
    for name in args.models:
        model, inputs = build(name)
        compiled = {}
        with torch.no_grad():
            for value in values:
                with smelt.config.override(**{field: value}):
                    compiled[value] = torch.compile(copy.deepcopy(model), backend="smelt")
                    compiled[value](*inputs)
            times = {value: [] for value in compiled}
            for _ in range(3):
                for fn in compiled.values():
                    fn(*inputs)
            for _ in range(args.calls):
                for value, fn in compiled.items():
                    start = time.perf_counter()
                    fn(*inputs)
                    times[value].append(time.perf_counter() - start)
        medians = {value: statistics.median(t) * 1e3 for value, t in times.items()}
        first = medians[values[0]]
        shown = ", ".join(f"{field}={value} {ms:.2f} ms ({first / ms:.2f}x)" for value, ms in medians.items())
        print(f"{name}: {shown}", flush=True)


if __name__ == "__main__":
    main()
