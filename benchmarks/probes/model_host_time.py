"""Host time per call of a model suite model on the GPU (issue 22): each call alone with the GPU idle
(median of 30), back-to-back calls (do_bench), then cProfile's functions by own time over 20 of
smelt's calls. --micro first times the host side of single calls the wrapper makes (allocation,
an ATen call through its OpOverload and through torch.<name>). --settings compiles smelt once per
setting (smelt.config.override's field=value pairs, several joined by commas) and --rounds repeats
the whole sequence, so that an A/B of a setting reads against the host's drift.

    python -m benchmarks.probes.model_host_time resnet50 --mode infer_bf16 --backends smelt,inductor [--micro]
    python -m benchmarks.probes.model_host_time efficientnet --settings pointwise_convolutions=off \
        pointwise_convolutions=on --rounds 2 --no-profile
    SMELT_GRAPH_CACHE=0 python -m benchmarks.probes.model_host_time swin --backends smelt,eager,inductor,smelt \
        --suite-options

--suite-options compiles each smelt row as the model suite's timed row does (the graph cache on, an empty
cache folder of its own, kernels compiled by its workers), but a first row, compiled as the suite's accuracy
check is: with SMELT_GRAPH_CACHE=0 and the backends above, the process is the suite's (its accuracy check,
then eager, Inductor, smelt). `eager` is plain eager.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import tempfile
import time

import torch
import triton.testing

import smelt.config
from benchmarks.probes.gpu_model_profile import parse_setting
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def best_us(fn, n: int = 400) -> float:
    """Host microseconds per call, best of 5 bursts short enough not to fill the launch queue."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
        torch.cuda.synchronize()
    return best


def micro() -> None:
    from torch._C._dynamo.guards import _empty_strided_cuda
    aten, cuda = torch.ops.aten, torch.device("cuda:0")
    x, w = torch.randn(1, 8, 4, 4, device=cuda), torch.randn(8, 8, 1, 1, device=cuda)
    a = torch.randn(8, 8, device=cuda)
    rows = {
        "torch.empty_strided(device=cuda)": lambda: torch.empty_strided((8, 8), (8, 1), device=cuda, dtype=torch.float32),
        "_empty_strided_cuda": lambda: _empty_strided_cuda((8, 8), (8, 1), torch.float32),
        "aten.convolution.default (tiny)": lambda: aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
        "torch.convolution (tiny)": lambda: torch.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
        "aten.mm.default (8x8)": lambda: aten.mm.default(a, a),
        "torch.mm (8x8)": lambda: torch.mm(a, a),
    }
    for label, fn in rows.items():
        print(f"{label:40s} {best_us(fn):6.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--backends", default="smelt")
    parser.add_argument("--micro", action="store_true")
    parser.add_argument("--lines", type=int, default=22)
    parser.add_argument("--settings", nargs="+", default=["default"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--profile-all", action="store_true", help="cProfile every compiled backend, not only smelt")
    parser.add_argument("--suite-options", action="store_true")
    args = parser.parse_args()
    folders = tempfile.TemporaryDirectory(prefix="smelt-host-")
    if args.micro:
        micro()
    runs = [(backend, setting) for backend in args.backends.split(",")
            for setting in (args.settings if backend == "smelt" else ["default"])]
    for name in args.models:
        spec = all_specs()[name]
        for row, (backend, setting) in enumerate(runs * args.rounds):
            torch._dynamo.reset()
            start = time.perf_counter()
            overrides = parse_setting(setting)
            options = None
            if args.suite_options and backend == "smelt" and row > 0:
                options = {"graph_cache": True, "cache_dir": os.path.join(folders.name, f"{name}-{row}")}
            with smelt.config.override(**overrides) if overrides else contextlib.nullcontext():
                fn = case_callable(spec, args.mode, "real", "cuda", 0, None if backend == "eager" else backend,
                                   options=options)
                fn()
                fn()
            torch.cuda.synchronize()
            if setting != "default":
                backend = f"{backend} {setting}"
            print(f"{backend}: first calls {time.perf_counter() - start:.1f} s")
            walls = []
            for _ in range(30):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                walls.append((time.perf_counter() - start) * 1e3)
                torch.cuda.synchronize()
            print("  idle calls in order (ms):", " ".join(f"{w:.2f}" for w in walls))
            walls.sort()
            gpu = triton.testing.do_bench(fn, return_mode="median")
            print(f"{name} {args.mode} {backend}: host ms/call {walls[15]:.3f} (min {walls[0]:.3f}), "
                  f"back-to-back {gpu:.3f} ms", flush=True)
            profiled = backend.startswith("smelt") or (args.profile_all and backend != "eager")
            if profiled and not args.no_profile:
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.lines)


if __name__ == "__main__":
    main()
