"""Inference of model suite models on the CPU at their real configs and a small batch, eager against
smelt in one process (issue 23): median ms of alternating calls after the compile.

    python -m benchmarks.probes.cpu_suite_speed --models bert,albert,gemma [--batch 1] [--seq 64] [--calls 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,albert")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    import smelt  # noqa: F401  (registers the backend)
    from smelt.tools.model_suite import zoo_text, zoo_vision
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    zoo_text.BATCH["real"] = zoo_vision.BATCH["real"] = args.batch
    zoo_text.SEQ["real"] = args.seq
    specs = all_specs()
    print(f"| model (batch {args.batch} x {args.seq}, fp32) | eager ms | smelt ms | smelt vs eager | first call s |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        torch._dynamo.reset()
        eager = case_callable(specs[name], "infer_fp32", "real", "cpu", 0, None)
        ours = case_callable(specs[name], "infer_fp32", "real", "cpu", 0, "smelt")
        start = time.perf_counter()
        ours()
        first = time.perf_counter() - start
        times: dict[str, list[float]] = {"eager": [], "smelt": []}
        for _ in range(args.calls):
            for key, fn in (("eager", eager), ("smelt", ours)):
                start = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - start) * 1e3)
        e, s = statistics.median(times["eager"]), statistics.median(times["smelt"])
        print(f"| {name} | {e:.1f} | {s:.1f} | {e / s:.2f}x | {first:.1f} |", flush=True)


if __name__ == "__main__":
    main()
