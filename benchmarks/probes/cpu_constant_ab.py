"""A CPU model compiled once per value of one of smelt's module constants, the compiled functions called
alternately in one process (issue 23): median ms a call of each. For codegen and scheduling constants
that are not settings (cpu_setting_ab takes those).

    python -m benchmarks.probes.cpu_constant_ab llama --constant smelt.codegen.halide.schedule.LONG_ROW \
        --values "10**9; 8192"
    python -m benchmarks.probes.cpu_constant_ab llama bert --constant smelt.scheduler.workspace.OUT_VARIANTS \
        --values "set(); {'aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm'}"

--values: Python expressions separated by ";", each evaluated and set before that variant compiles (the
graph cache is off, so each compiles afresh); the constant is restored at the end.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import statistics
import time

import torch

import smelt
from benchmarks.cpu_models import build


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--constant", required=True, help="module.NAME")
    parser.add_argument("--values", required=True, help='Python expressions separated by ";"')
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    module_name, _, name = args.constant.rpartition(".")
    module = importlib.import_module(module_name)
    default = getattr(module, name)
    values = [text.strip() for text in args.values.split(";")]
    try:
        for model_name in args.models:
            model, inputs = build(model_name)
            compiled = {}
            for text in values:
                setattr(module, name, eval(text))  # noqa: S307 - a developer's probe, its own command line
                torch._dynamo.reset()
                with smelt.config.override(graph_cache=False), torch.no_grad():
                    fn = torch.compile(copy.deepcopy(model), backend="smelt")
                    fn(*inputs)
                    fn(*inputs)
                compiled[text] = fn
            times = {text: [] for text in compiled}
            with torch.no_grad():
                for _ in range(args.calls):
                    for text, fn in compiled.items():
                        start = time.perf_counter()
                        fn(*inputs)
                        times[text].append(time.perf_counter() - start)
            print(f"{model_name} ({name}): " + ", ".join(
                f"{text} {statistics.median(t) * 1e3:.2f} ms" for text, t in times.items()), flush=True)
    finally:
        setattr(module, name, default)


if __name__ == "__main__":
    main()
