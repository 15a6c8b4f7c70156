"""Combo launches with the Triton backend's keys limited to steps that can share a launch
(scheduler/combo.with_a_possible_partner) and with every candidate step keyed: the combos made
(which must be the same) and the seconds `combine` takes, per model-suite case (tiny, the CPU,
Triton's interpreter, whose Target is the GPU's). The first variant run in a process pays warm-ups:
`--order` picks which goes first.

    python -m benchmarks.probes.combo_keys llama:train bert:train [--order all,limited]
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="model:mode")
    parser.add_argument("--order", default="all,limited")
    args = parser.parse_args()
    os.environ["SMELT_CPU_BACKEND"] = "triton"
    os.environ["SMELT_GRAPH_CACHE"] = "0"
    import torch
    from smelt import pipeline
    from smelt.codegen.triton import combo
    from smelt.tools.model_suite.torchvision_stub import install_if_missing
    install_if_missing()
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs

    combine, limited = pipeline.combine, combo.with_a_possible_partner
    made: list = []

    def timed(steps, key_of, *a, **k):
        start = time.perf_counter()
        out = combine(steps, key_of, *a, **k)
        made.append((tuple(tuple(sorted(n.name for m in s.combo for n in m.nodes)) for s in out if s.combo),
                     time.perf_counter() - start))
        return out
    pipeline.combine = timed
    print("| case | graphs | same combos | combos per graph | combine s, limited | combine s, every step keyed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case in args.cases:
        name, mode = case.split(":")
        runs = {}
        for variant in args.order.split(","):
            combo.with_a_possible_partner = limited if variant == "limited" else (lambda steps, family: {id(s) for s in steps})
            made.clear()
            torch._dynamo.reset()
            case_callable(all_specs()[name], mode, "tiny", "cpu", 0, "smelt")()
            runs[variant] = list(made)
        a, b = runs["limited"], runs["all"]
        same = len(a) == len(b) and all(x[0] == y[0] for x, y in zip(a, b))
        print(f"| {case} | {len(a)} | {same} | {[len(x[0]) for x in a]} | {sum(x[1] for x in a):.2f} | "
              f"{sum(x[1] for x in b):.2f} |", flush=True)
    combo.with_a_possible_partner = limited
    sys.exit(0)


if __name__ == "__main__":
    main()
