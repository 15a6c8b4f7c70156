"""Where a cold compile goes, stage by stage (issue 24): each workload compiled by smelt in a fresh
process with brand-new cache dirs, then again warm; smelt's own stages (smelt/compile_stages.py)
and the rest (Dynamo's trace, AOTAutograd, the first call's kernel launches and GPU compiles).

    python -m benchmarks.probes.compile_stages model:resnet18 model:bert softmax [--device cpu]

Workloads are benchmarks.compile_time's: a benchmarks/workloads.py row, `model:NAME` of
benchmarks/cpu_models.py, or adam_step.
"""
from __future__ import annotations

import argparse
import tempfile

from benchmarks.compile_time import run_once_with_stages

STAGES = ("cache", "plan", "lower", "schedule", "codegen", "load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print(f"| workload | run | first call s | {' | '.join(STAGES)} | smelt total | the rest |")
    print("|---" * (5 + len(STAGES)) + "|")
    for workload in args.workloads:
        with tempfile.TemporaryDirectory(prefix="smelt_stages_") as root:
            for run in ("cold", "warm"):
                seconds, stages = run_once_with_stages("smelt", workload, args.device, False, root, args.timeout)
                ours = sum(stages.values())
                cells = " | ".join(f"{stages.get(s, 0.0):.2f}" for s in STAGES)
                print(f"| {workload} | {run} | {seconds:.2f} | {cells} | {ours:.2f} | {seconds - ours:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
