"""Where a real model's GPU time goes (issue 22): eager, Inductor and smelt under each of a few
settings, timed in one process (median of do_bench), then torch.profiler's kernels of one call each
of Inductor and smelt, summed by kind (cuDNN's layout conversions, convolutions and matrix
products, the compilers' own kernels, the rest) with the costliest kernels named.

    python -m benchmarks.probes.gpu_model_profile resnet50 convnext --mode infer_bf16 \\
        --settings channels_last=off channels_last=on [--top 8] [--no-inductor]

Models are the model suite's (smelt/tools/model_suite) at real size; a setting is one of
smelt.config.override's field=value pairs, several joined by commas. A name with dots in it is a
constant of a smelt module set for that setting's compile, the graph cache off
(`codegen.triton.kernel.ELEMENTS_PER_WARP=1024`: a heuristic's constant tried on a whole model).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import re

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

import smelt.config
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs

# Kernel names of cuDNN's NCHW <-> NHWC conversions and of cuDNN / cuBLAS compute kernels.
_LAYOUT_WORDS = ("nchwtonhwc", "nhwctonchw", "converttensor", "transpose")
_LIBRARY_WORDS = ("cudnn", "xmma", "cutlass", "gemm", "conv", "nvjet", "sm90_", "sm80_", "cublas", "implicit")


def kind_of(name: str) -> str:
    low = name.lower()
    if any(w in low for w in _LAYOUT_WORDS):
        return "layout conversion"
    if low.startswith(("triton_", "smelt_", "poi_", "red_", "per_", "combo_")) or "fused" in low:
        return "compiler kernels"
    if any(w in low for w in _LIBRARY_WORDS):
        return "cuDNN / cuBLAS"
    return "other (ATen)"


def kernel_table(fn, calls: int = 10) -> list[tuple[str, float, int]]:
    """(name, microseconds per call, launches per call) of each CUDA kernel, costliest first."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        if us > 0:
            rows.append((event.key, us / calls, event.count // calls))
    return sorted(rows, key=lambda r: -r[1])


def report(label: str, rows, top: int) -> None:
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    for name, us, count in rows:
        by_kind[kind_of(name)][0] += us
        by_kind[kind_of(name)][1] += count
    total = sum(us for _, us, _ in rows)
    kinds = ", ".join(f"{k} {v[0] / 1e3:.3f} ms ({v[1]})" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][0]))
    print(f"  {label}: GPU {total / 1e3:.3f} ms per call, {sum(c for _, _, c in rows)} launches: {kinds}")
    # Kernels named alike but for their number (smelt names each kernel of a graph apart) summed as one.
    families = collections.defaultdict(lambda: [0.0, 0])
    for name, us, count in rows:
        family = re.sub(r"_\d+$", "_N", name)
        families[family][0] += us
        families[family][1] += count
    for name, (us, count) in sorted(families.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"      {us:8.1f} us  x{count:<3d} {name[:110]}")


def parse_setting(text: str) -> dict:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair) if text != "default" else {}


@contextlib.contextmanager
def applied(setting: dict):
    """smelt.config.override of the setting's fields; its dotted names set as module constants."""
    import ast
    import importlib
    constants = {k: v for k, v in setting.items() if "." in k}
    fields = {k: v for k, v in setting.items() if "." not in k}
    if constants:
        fields["graph_cache"] = False  # the cache's key does not see a patched constant
    saved = []
    try:
        for name, value in constants.items():
            module, attribute = name.rsplit(".", 1)
            module = importlib.import_module(f"smelt.{module}")
            saved.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, ast.literal_eval(value))
        with smelt.config.override(**fields) if fields else contextlib.nullcontext():
            yield
    finally:
        for module, attribute, value in reversed(saved):
            setattr(module, attribute, value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--settings", nargs="+", default=["default"])
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--inductor-last", action="store_true",
                        help="Inductor after smelt's settings (a GPU's clocks may drift over a run)")
    args = parser.parse_args(argv)
    specs = all_specs()
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for name in args.models:
        spec = specs[name]
        runs = [("eager", None, {})]
        inductor = [] if args.no_inductor else [("inductor", "inductor", {})]
        smelts = [(f"smelt {s}", "smelt", parse_setting(s)) for s in args.settings]
        runs += smelts + inductor if args.inductor_last else inductor + smelts
        times = {}
        for label, backend, setting in runs:
            torch._dynamo.reset()
            fn = case_callable(spec, args.mode, "real", "cuda", 0, backend)
            with applied(setting):
                fn()  # compiles (a training step compiles its backward in its first call too)
                fn()
            torch.cuda.synchronize()
            times[label] = triton.testing.do_bench(fn, return_mode="median")
            if backend is not None and not args.no_profile:
                times[label, "rows"] = kernel_table(fn)
            del fn
        eager = times["eager"]
        summary = ", ".join(f"{label} {times[label]:.3f} ms" for label, _, _ in runs)
        print(f"\n{name} {args.mode}: {summary}")
        for label, backend, _ in runs[1:]:
            vs = f"{eager / times[label]:.2f}x eager" + (
                f", {times['inductor'] / times[label]:.2f}x inductor" if "inductor" in times and backend == "smelt" else "")
            print(f"  {label}: {vs}")
        for label, backend, _ in runs[1:]:
            if (label, "rows") in times:
                report(label, times[label, "rows"], args.top)


if __name__ == "__main__":
    main()
