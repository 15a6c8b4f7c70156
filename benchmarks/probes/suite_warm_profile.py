"""Where a warm start's time goes over Dynamo's own (issue 24): a model-suite case's first call in a
process whose caches a cold process filled, under cProfile, beside Dynamo alone (backend "eager")
under cProfile too; own time summed by area (smelt, Triton, Dynamo, AOTAutograd and FX, the model's
code, built-ins), then smelt's and Triton's functions by cumulative time.

    python -m benchmarks.probes.suite_warm_profile vit:train [--device cuda] [--top 25]
"""
from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile

CHILD = r"""
import cProfile, sys, time, torch
backend, name, mode, device, dump = sys.argv[1:6]
if backend == "smelt":
    import smelt  # noqa: F401
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs
size = "real" if device == "cuda" else "tiny"
fn = case_callable(all_specs()[name], mode, size, device, 0, backend)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
sync()
prof = cProfile.Profile() if dump != "-" else None
start = time.perf_counter()
if prof:
    prof.enable()
fn()
sync()
if prof:
    prof.disable()
    prof.dump_stats(dump)
print("first call s", round(time.perf_counter() - start, 3))
"""

# (label, substrings of a profiled function's file); the first that matches names its area.
AREAS = [
    ("smelt", ("/smelt/",)),
    ("Triton", ("/triton/",)),
    ("Dynamo", ("/torch/_dynamo/",)),
    ("AOTAutograd, FX, fake tensors", ("/torch/_functorch/", "/torch/fx/", "/torch/_subclasses/", "/torch/_decomp/",
                                       "/torch/_prims", "/torch/_refs/", "/torch/utils/_sympy/", "/sympy/")),
    ("model code (torch.nn, timm, transformers)", ("/torch/nn/", "/timm/", "/transformers/")),
    ("other torch", ("/torch/",)),
    ("built-ins (C calls)", ("~",)),
]


def _area(filename: str) -> str:
    for label, marks in AREAS:
        if any(m in filename for m in marks):
            return label
    return "other Python"


def area_seconds(stats: pstats.Stats) -> dict[str, float]:
    out: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in stats.stats.items():
        out[_area(filename)] = out.get(_area(filename), 0.0) + own
    return out


def _run(backend: str, case: str, device: str, env: dict, dump: str) -> str:
    name, mode = case.split(":")
    done = subprocess.run([sys.executable, "-c", CHILD, backend, name, mode, device, dump], capture_output=True,
                          text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{backend} {case} failed: {done.stderr.strip()[-800:]}")
    return done.stdout.strip().splitlines()[-1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="MODEL:MODE of smelt.tools.model_suite")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "SMELT_CACHE_DIR": os.path.join(root, "smelt"),
               "TRITON_CACHE_DIR": os.path.join(root, "triton"), "PYTHONPATH": os.getcwd()}
        print("smelt cold (fills the caches):", _run("smelt", args.case, args.device, env, "-"))
        dumps = {b: os.path.join(root, f"{b}.prof") for b in ("smelt", "eager")}
        for backend, dump in dumps.items():
            print(f"{backend} warm, profiled:", _run(backend, args.case, args.device, env, dump))
        stats = {b: pstats.Stats(d) for b, d in dumps.items()}
        areas = {b: area_seconds(s) for b, s in stats.items()}
        print("\n| area (own time) | smelt warm s | Dynamo alone s | difference s |\n| --- | --- | --- | --- |")
        for label in sorted(set(areas["smelt"]) | set(areas["eager"]), key=lambda k: -areas["smelt"].get(k, 0.0)):
            s, e = areas["smelt"].get(label, 0.0), areas["eager"].get(label, 0.0)
            print(f"| {label} | {s:.3f} | {e:.3f} | {s - e:+.3f} |")
        print(f"| all | {sum(areas['smelt'].values()):.3f} | {sum(areas['eager'].values()):.3f} | |")
        print(f"\nsmelt's and Triton's functions by cumulative time (smelt warm), top {args.top}:")
        ours = pstats.Stats(dumps["smelt"])
        ours.stats = {k: v for k, v in ours.stats.items() if "/smelt/" in k[0] or "/triton/" in k[0]}
        ours.sort_stats("cumulative").print_stats(args.top)
        # Functions outside smelt, by how much more of their own time (and of their callees', where
        # both ran them) the smelt process spent: what smelt's warm start made the rest do.
        theirs = stats["eager"].stats
        for column, label in ((2, "own"), (3, "cumulative")):
            print(f"\nfunctions outside smelt by {label} time, smelt warm minus Dynamo alone, top {args.top}:")
            gaps = []
            for key, value in stats["smelt"].stats.items():
                if "/smelt/" in key[0] or (column == 3 and key not in theirs):
                    continue
                other = theirs.get(key, (0, 0, 0.0, 0.0))
                gaps.append((value[column] - other[column], value[1], other[1], key))
            for gap, calls, other_calls, key in sorted(gaps, reverse=True)[: args.top]:
                where = "built-in" if key[0] == "~" else f"{key[0].split('site-packages/')[-1]}:{key[1]}"
                print(f"  {gap:+.3f} s  {calls} / {other_calls} calls  {where} {key[2][:80]}")


if __name__ == "__main__":
    main()
