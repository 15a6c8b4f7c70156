"""Compares smelt's default Halide schedule with the autoschedulers shipped in the halide wheel.

Run: SMELT_CPU_BACKEND=halide python -m benchmarks.probes.halide_autoschedulers
Each workload is compiled by smelt once (to get its generated pipeline source), then the
pipeline's algorithm alone (`name(schedule=False)`) is scheduled by each autoscheduler, given the
real sizes as estimates, JIT-compiled and timed on the same tensors against the default schedule.
"""
from __future__ import annotations

import os
import time

import halide as hl
import numpy as np
import torch

import smelt  # noqa: F401
from benchmarks.measure import median_call_ms
import smelt.observe
from smelt.runtime.halide_compile import load_source

PLUGINS = {"Mullapudi2016": "libautoschedule_mullapudi2016.so", "Li2018": "libautoschedule_li2018.so",
           "Adams2019": "libautoschedule_adams2019.so"}


def workloads():
    yield "softmax 4096x1024", lambda a: torch.softmax(a, -1), torch.randn(4096, 1024)
    yield "row sum 4096x1024", lambda a: a.sum(-1), torch.randn(4096, 1024)
    yield "column sum 1024x4096", lambda a: a.sum(0), torch.randn(1024, 4096)
    yield "add_gelu 4M", lambda a: torch.nn.functional.gelu(a + 1), torch.randn(4 << 20)



def main():
    os.environ["SMELT_SPLIT_REDUCTIONS"] = "0"  # one kernel per workload
    folder = os.path.join(os.path.dirname(hl.__file__), "lib64")
    for plugin in PLUGINS.values():
        hl.load_plugin(os.path.join(folder, plugin))
    target = hl.get_host_target().with_feature(hl.TargetFeature.StrictFloat)
    print(f"{'workload':24} {'schedule':14} {'compile s':>9} {'ms':>8}")
    for title, fn, x in workloads():
        smelt.observe.reset()
        torch._dynamo.reset()
        torch.compile(fn, backend="smelt")(x)
        (graph,) = smelt.observe.compiled_graphs()
        (name, source), = graph.kernel_sources.items()
        module = load_source(name, source)
        xnumel, rnumel = (x.shape[0], x.shape[1]) if x.dim() == 2 else (x.numel(), 1)
        if "column" in title:
            xnumel, rnumel = x.shape[1], x.shape[0]
        out_numel = fn(x).numel()
        data = x.numpy()
        for schedule in ["default"] + list(PLUGINS):
            pipeline, arguments = getattr(module, name)(schedule=schedule == "default")
            sizes = {"xnumel": xnumel, "rnumel": rnumel}
            for a in arguments:
                if isinstance(a, hl.ImageParam):
                    a.set_estimates([(0, data.size)])
                    a.set(hl.Buffer(data.reshape(-1)))
                else:
                    a.set_estimate(sizes[a.name()])
                    a.set(sizes[a.name()])
            for out in pipeline.outputs():
                out.set_estimates([(0, out_numel)])
            start = time.perf_counter()
            try:
                if schedule != "default":
                    pipeline.apply_autoscheduler(target, hl.AutoschedulerParams(schedule))
                pipeline.compile_jit(target)
            except Exception as e:  # an autoscheduler may refuse a pipeline
                print(f"{title:24} {schedule:14} failed: {str(e).splitlines()[0][:80]}")
                continue
            seconds = time.perf_counter() - start
            result = hl.Buffer(np.empty(out_numel, dtype=np.float32))
            ms = median_call_ms(lambda: pipeline.realize([result]), (), 15, warmup=1)
            print(f"{title:24} {schedule:14} {seconds:9.2f} {ms:8.3f}")


if __name__ == "__main__":
    main()
