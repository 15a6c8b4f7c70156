"""Can a warm process skip Dynamo's trace of the Adam step (issue 6)? Probes the installed torch.

    python3 -m benchmarks.probes.dynamo_precompile_probe [--device cuda] [--full]

1. Dynamo's own phase times for one trace of `opt.step` (eager backend: no compiler time at all).
2. Dynamo's precompile, the only way torch offers to skip that trace in a later process:
   `torch.compile(fullgraph=True).aot_compile` of Adam's undecorated `step` under no_grad (the
   decorated one has deliberate graph breaks in `_use_grad`), saved, then loaded in a fresh process.
   On torch 2.13 the save holds the optimizer's state tensors by value (they are graph
   attributes behind ID_MATCH guards, not inputs) and the load fails unpickling the guard state.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.optimizer_step import make  # noqa: E402


def undecorated_step():
    step = torch.optim.Adam.step
    while hasattr(step, "__wrapped__"):
        step = step.__wrapped__
    return step


def trace_phases(device: str, small: bool) -> None:
    _, opt = make(device, small, True)
    opt.step()
    start = time.perf_counter()
    torch.compile(opt.step, backend="eager")()
    print(f"Dynamo trace of opt.step: {time.perf_counter() - start:.2f} s")
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True))


def save(device: str, small: bool, path: str) -> None:
    _, opt = make(device, small, True)
    opt.step()
    held = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    held += sum(p.numel() * p.element_size() for p in opt.param_groups[0]["params"])
    with torch.no_grad():
        compiled = torch.compile(undecorated_step(), fullgraph=True, backend="eager").aot_compile(((opt,), {}))
    compiled.save_compiled_function(path)
    print(f"aot_compile saved {os.path.getsize(path) / 1e6:.1f} MB; parameters and state hold {held / 1e6:.1f} MB")


def load(device: str, small: bool, path: str) -> None:
    params, opt = make(device, small, True)
    opt.step()
    try:
        with open(path, "rb") as f:
            compiled = torch.compiler.load_compiled_function(f)
    except Exception as e:  # noqa: BLE001 - the failure is what this probe reports
        print(f"load in a fresh process failed: {type(e).__name__}: {str(e)[:300]}")
        return
    before = params[0].detach().clone()
    with torch.no_grad():
        compiled(opt)
    print(f"loaded; the live optimizer's first parameter moved: {not torch.equal(before, params[0])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--full", action="store_true", help="benchmarks.optimizer_step's full shapes")
    parser.add_argument("--phase", choices=["all", "save", "load"], default="all")
    parser.add_argument("--path")
    args = parser.parse_args()
    print(f"torch {torch.__version__}")
    if args.phase == "save":
        return save(args.device, not args.full, args.path)
    if args.phase == "load":
        return load(args.device, not args.full, args.path)
    trace_phases(args.device, not args.full)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "adam_step.pt2")
        for phase in ("save", "load"):  # each in a fresh process, as a warm start would be
            cmd = [sys.executable, __file__, "--phase", phase, "--path", path, "--device", args.device]
            proc = subprocess.run(cmd + (["--full"] if args.full else []), capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if not line.startswith("torch ")]
            print("\n".join(lines) or f"{phase} failed: {proc.stderr.strip().splitlines()[-1:]}")


if __name__ == "__main__":
    main()
