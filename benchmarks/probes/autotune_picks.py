"""Whether autotuning's picks are fast in the model (issue 22).

Under SMELT_AUTOTUNE=1 EfficientNet's bf16 inference took 15% more GPU time than the block heuristic
alone (RESULTS, thirty-ninth and fortieth sessions: do_bench's timings of small kernels were noise).
This compiles a model with the heuristic's blocks and then with autotuning (a fresh cache folder, so
every kernel is timed), profiles each kernel by kernel, and prints the GPU time, the first call's time
(tuning included), the launches that went the launcher's whole path in steady state, and the kernels
whose in-model time moved most against the heuristic's, with the candidates' timings.

    python -m benchmarks.probes.autotune_picks efficientnet [--mode infer_bf16]
"""
from __future__ import annotations

import argparse
import collections
import logging
import re
import tempfile
import time

import torch
import triton

import smelt.config
from smelt.runtime.launcher import TritonLauncher
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs

from .gpu_model_profile import kernel_table


class _Picks(logging.Handler):
    """The autotuner's debug lines: kernel name -> its line."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: dict[str, str] = {}

    def emit(self, record):
        text = record.getMessage()
        found = re.match(r"smelt: autotuned (\S+) over (.*) /", text)
        if found:
            self.lines[found.group(1)] = found.group(2)


def run(spec, mode, tuned: bool):
    torch._dynamo.reset()
    picks = _Picks()
    logger = logging.getLogger("smelt")
    level = logger.level
    logger.addHandler(picks)
    logger.setLevel(logging.DEBUG)
    try:
        with tempfile.TemporaryDirectory() as cache:
            setting = {"cache_dir": cache}
            if tuned:
                setting["autotune"] = True
            fn = case_callable(spec, mode, "real", "cuda", 0, "smelt")
            with smelt.config.override(**setting):
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                first = time.perf_counter() - start
                fn()
            torch.cuda.synchronize()
            wall = triton.testing.do_bench(fn, return_mode="median")
            rows = kernel_table(fn, calls=20)
            slow = _slow_launches(fn)
    finally:
        logger.removeHandler(picks)
        logger.setLevel(level)
    return first, wall, rows, picks.lines, slow


def _slow_launches(fn, calls: int = 5) -> collections.Counter:
    """Launches per call that went the launcher's whole path, not a remembered launch, by kernel."""
    counts = collections.Counter()
    original = TritonLauncher._resolve_and_launch

    def counting(self, args, key):
        counts[self.name] += 1
        return original(self, args, key)
    TritonLauncher._resolve_and_launch = counting
    try:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    finally:
        TritonLauncher._resolve_and_launch = original
    return collections.Counter({k: v / calls for k, v in counts.items()})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    specs = all_specs()
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for name in args.models:
        results = {label: run(specs[name], args.mode, tuned)
                   for label, tuned in (("heuristic", False), ("tuned", True))}
        base = {n: us for n, us, _ in results["heuristic"][2]}
        print(f"\n{name} {args.mode}")
        for label, (first, wall, rows, lines, slow) in results.items():
            ours = sum(us for n, us, _ in rows if n in base and n.startswith(("triton_", "smelt_", "combo_")))
            gpu = sum(r[1] for r in rows) / 1e3
            print(f"  {label:10s} first call {first:6.1f} s, wall {wall:.3f} ms, GPU {gpu:.3f} ms"
                  f" (compiler kernels {ours / 1e3:.3f} ms), {len(lines)} kernels tuned; launches a call on the"
                  f" launcher's whole path: {sum(slow.values()):.0f} {slow.most_common(3)}")
        for label, (_, _, rows, lines, _) in results.items():
            if label == "heuristic":
                continue
            moved = sorted(((us - base[n], n, us) for n, us, _ in rows if n in base), reverse=True)
            print(f"  {label}: kernels slower than the heuristic's, then faster (us in the model; candidates' timings,"
                  f" the heuristic's first)")
            for delta, n, us in moved[:args.top] + moved[-args.top:]:
                print(f"    {delta:+7.1f} us  {base[n]:7.1f} -> {us:7.1f}  {n[:60]}  {lines.get(n, '-')[:150]}")


if __name__ == "__main__":
    main()
