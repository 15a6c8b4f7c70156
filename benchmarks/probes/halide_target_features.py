"""What Halide's asserts and bounds queries cost a CPU kernel's compile (issues 23 and 24).

Takes a sample of the CPU Halide kernels kept in a smelt cache's `sources` folder (run any workload
or test files with SMELT_CACHE_DIR set first) and compiles each to an object file (`compile_to_file`,
no link) for three targets: Halide's default checks, without asserts, and without asserts or bounds
queries (smelt's target, halide_compile.kernel_target, for kernels without an index check). The
targets are taken in a rotating order per kernel, so no one of them always comes first (warm caches
and memory). Prints the summed seconds per target and the kernels that took longest.

    python -m benchmarks.probes.halide_target_features /path/to/cache [--sample 60] [--seed 3] [--largest]

--largest takes the kernels with the most buffers (an optimizer's combo kernels) instead of a random sample.
"""
from __future__ import annotations

import argparse
import glob
import os
import random
import tempfile
import time

import halide as hl

from smelt.runtime.halide_compile import checks_indices, compiler_messages_to_log, kernel_target, load_source, target


def targets() -> dict[str, object]:
    """The target before smelt dropped the checks, one step between, and smelt's own."""
    base = target().with_feature(hl.TargetFeature.NoRuntime).with_feature(hl.TargetFeature.StrictFloat)
    return {"checks": base, "no asserts": base.with_feature(hl.TargetFeature.NoAsserts),
            "no asserts, no bounds query": kernel_target(checks_indices=False)}


def cpu_kernels(cache: str) -> list[str]:
    paths = []
    for path in sorted(glob.glob(os.path.join(cache, "sources", "*", "halide_*.py"))):
        with open(path) as f:
            text = f.read()
        # Sources older than their ASSERTS line show an index check by its hl.require.
        if "DEVICE = 'cpu'" in text and not checks_indices(text) and "hl.require(" not in text:
            paths.append(path)
    return paths


def buffers(path: str) -> int:
    with open(path) as f:
        return f.read().count("hl.ImageParam(")


def compile_seconds(path: str, target, folder: str) -> float:
    name = os.path.basename(path).rsplit("_", 1)[0]
    with open(path) as f:
        module = load_source(name, f.read(), path)
    pipeline, arguments = getattr(module, name)()
    start = time.perf_counter()
    with compiler_messages_to_log(name):
        pipeline.compile_to_file(os.path.join(folder, "k"), arguments, "k", target)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cache")
    p.add_argument("--sample", type=int, default=60)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--largest", action="store_true")
    args = p.parse_args()
    paths = cpu_kernels(args.cache)
    if args.largest:
        sample = sorted(paths, key=buffers, reverse=True)[:args.sample]
    else:
        sample = random.Random(args.seed).sample(paths, min(args.sample, len(paths)))
    chosen = targets()
    names = list(chosen)
    totals = dict.fromkeys(names, 0.0)
    per_kernel = []
    with tempfile.TemporaryDirectory() as folder:
        for i, path in enumerate(sample):
            times = {}
            for k in range(len(names)):
                label = names[(i + k) % len(names)]
                times[label] = compile_seconds(path, chosen[label], folder)
                totals[label] += times[label]
            per_kernel.append((times[names[0]], os.path.basename(path), times))
    chosen_how = "the largest" if args.largest else f"seed {args.seed}"
    print(f"{len(sample)} of {len(paths)} CPU kernels ({chosen_how}), compile_to_file seconds summed:")
    for label in names:
        print(f"  {label:30s} {totals[label]:8.2f}  ({totals[label] / totals[names[0]]:.2f}x)")
    print(f"longest {args.top} with checks:")
    for _, name, times in sorted(per_kernel, reverse=True)[:args.top]:
        print(f"  {name}: " + ", ".join(f"{label} {t:.2f}" for label, t in times.items()))


if __name__ == "__main__":
    main()
