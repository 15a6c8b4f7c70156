"""Where a cold compile of the Adam step goes (benchmarks/optimizer_step.py's parameters): wall
time of Dynamo, AOTAutograd and each smelt stage, measured with timers around them.

    python3 -m benchmarks.probes.compile_breakdown [--small] [--device cuda] [--for-loop] [--profile 40]

--profile N also prints the N functions with the most own time inside smelt's generate step (cProfile).
"""
from __future__ import annotations

import argparse
import collections
import os
import time

import torch

os.environ["SMELT_GRAPH_CACHE"] = "0"

from benchmarks.optimizer_step import make

spent: dict = collections.defaultdict(float)


def timed(owner, name, label):
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--for-loop", action="store_true", help="Adam with foreach=False")
    args = parser.parse_args()
    import smelt  # noqa: F401
    from smelt import backend, pipeline
    from smelt.codegen.triton import backend as triton_backend
    from smelt.runtime import kernel_binaries, launcher
    timed(backend, "aot_module_simplified", "AOTAutograd + smelt (all)")
    if args.profile:
        import cProfile
        profile = cProfile.Profile()
        generate = pipeline.generate_graph

        def profiled(*a, **k):
            profile.enable()
            try:
                return generate(*a, **k)
            finally:
                profile.disable()
        pipeline.generate_graph = profiled
    timed(pipeline, "generate_graph", "smelt: generate (all)")
    timed(pipeline, "lower_graph", "  lower")
    timed(pipeline, "make_schedule", "  schedule")
    timed(pipeline, "combine", "  combine")
    timed(triton_backend, "generate_kernel", "  kernel codegen")
    timed(triton_backend, "combo_kernel", "  combo codegen")
    timed(pipeline.WrapperCodegen, "generate", "  wrapper codegen")
    timed(pipeline, "assemble", "smelt: assemble")
    timed(kernel_binaries.KernelVariants, "_load_or_compile", "Triton compile")
    timed(launcher.TritonLauncher, "__call__", "launches (incl. compile)")
    params, opt = make(args.device, args.small, not args.for_loop)
    step = torch.compile(opt.step, backend="smelt")
    start = time.perf_counter()
    step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(f"first call {time.perf_counter() - start:.2f} s")
    for label, seconds in spent.items():
        print(f"  {label:32s} {seconds:.2f} s")
    if args.profile:
        import pstats
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
