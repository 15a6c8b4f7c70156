"""python -m smelt.tools.model_suite [--device cuda --size real --timings ...]: runs the zoo's
(model, mode) cases, one line per case as it ends, and a markdown table last."""
from __future__ import annotations

import argparse
import os
import sys
import time


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m smelt.tools.model_suite", description=__doc__)
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--size", choices=("tiny", "real"), default=None, help="default: real on CUDA, tiny on the CPU")
    p.add_argument("--models", default="",
                   help="comma-separated names (default: all); --list shows them; NAME:MODE runs only that "
                        "mode of NAME (e.g. densenet:infer_bf16,resnet18), whatever --modes says")
    p.add_argument("--modes", default="", help="comma-separated: infer_fp32,infer_bf16,train,dynamic,decode")
    p.add_argument("--backend", default="smelt", help="torch.compile backend to judge (e.g. aot_eager to check the suite)")
    p.add_argument("--timings", action="store_true",
                   help="time eager, Inductor and smelt (passing cases), cold compile seconds, peak memory")
    p.add_argument("--no-inductor", action="store_true", help="with --timings: leave Inductor out")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="compile with mode=\"reduce-overhead\" (three calls per case, the last compared); with "
                        "--timings, also time both compilers in that mode")
    p.add_argument("--graphs-only", action="store_true",
                   help="with --timings --cuda-graphs: time eager and the two graphed rows only (the default-mode "
                        "rows left out, about half the device time)")
    p.add_argument("--triage", action="store_true",
                   help="rerun each failing case with aot_eager: failures that remain are not smelt's")
    p.add_argument("--time-budget", type=float, default=0,
                   help="seconds; a case starts only if the longest case so far would end within them")
    p.add_argument("--markdown", help="also write the table here (rewritten as each case ends)")
    p.add_argument("--json", help="write every result (with failure messages) here (rewritten as each case ends)")
    p.add_argument("--list", action="store_true")
    return p.parse_args(argv)


def _cuda():
    import torch
    return torch.cuda.is_available()


def main(argv=None):
    args = parse(argv)
    if args.timings:  # cold compile times: neither compiler may read what an earlier process kept
        os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
        os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    import smelt  # noqa: F401  (registers the backend)
    from . import report
    from .modes import MODES, cases
    from .runner import CaseResult, run_case
    from .zoo import all_specs

    specs = all_specs()
    if args.list:
        for spec in specs.values():
            print(f"{spec.name:22s} {spec.family:8s} {spec.requires}")
        return 0
    if args.graphs_only and not args.cuda_graphs:
        sys.exit("--graphs-only times the CUDA-graph rows: it needs --cuda-graphs")
    size = args.size or ("real" if args.device.startswith("cuda") else "tiny")
    entries = [n.partition(":") for n in args.models.split(",") if n] or [(n, "", "") for n in specs]
    modes = [m for m in args.modes.split(",") if m] or list(MODES)
    unknown = [n for n, _, _ in entries if n not in specs]
    if unknown:
        sys.exit(f"unknown models {unknown}; --list shows the zoo")
    chosen = [case for name, _, mode in entries for case in cases([specs[name]], [mode] if mode else modes)]
    start = time.perf_counter()
    results = []
    longest = 0.0
    for spec, mode in chosen:
        # A device call's own limit kills a case it cannot finish and, with it, the table: such a
        # case is not begun (judged by the longest case so far).
        if args.time_budget and time.perf_counter() - start + longest > args.time_budget:
            results.append(CaseResult(spec.name, mode, size, args.device, "skip", notes=["past --time-budget"]))
            _write(args, results, report)
            continue
        case_start = time.perf_counter()
        r = run_case(spec, mode, size, args.device, args.backend, timings=args.timings,
                     timing_kw={"inductor": not args.no_inductor, "cuda_graphs": args.cuda_graphs,
                                "graphs_only": args.graphs_only},
                     compile_mode="reduce-overhead" if args.cuda_graphs else None)
        if args.triage and r.status in ("fail", "error"):
            again = run_case(spec, mode, size, args.device, "aot_eager")
            r.notes.insert(0, "aot_eager passes: smelt's bug" if again.passed
                           else f"aot_eager also {again.status}: not smelt's ({again.message(1)[:200]})")
        longest = max(longest, time.perf_counter() - case_start)
        results.append(r)
        _write(args, results, report)
        print(f"[{time.perf_counter() - start:7.1f}s] {r.model:20s} {r.mode:10s} {r.status:5s} {r.seconds:6.1f}s "
              f"{report.summary(r)} {r.message(2)}", flush=True)
    _write(args, results, report)  # also when no case ran: the files say so
    print()
    print(report.markdown(results))
    return 0 if all(r.status in ("pass", "skip") for r in results) else 1


def _write(args, results, report) -> None:
    """The JSON and the table as they stand: a run stopped from outside keeps its finished cases."""
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json(results))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.markdown(results) + "\n")


if __name__ == "__main__":
    sys.exit(main())
