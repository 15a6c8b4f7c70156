"""python -m smelt.tools.fuzz --count N --seed S [--device cpu|cuda] [--backward/--no-backward] [--out findings.md]

Runs N random programs (in batches of --batch independent programs, one compile each), prints a
progress line every --every programs, then a summary and each failure's shrunk program. Exit code 1
when any program failed."""
from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import time
import warnings

from .generator import generate
from .program import Program, merged
from .runner import Result, judge_program
from .shrinker import shrink


def program_seed(seed: int, k: int) -> int:
    return seed * 1_000_003 + k


def backend_name(device: str) -> str:
    from smelt.config import setting
    if device.startswith("cuda"):
        return "cuda/" + setting("SMELT_CUDA_BACKEND")
    return "cpu/" + setting("SMELT_CPU_BACKEND")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), timeout=5).stdout.strip() or "?"
    except Exception:
        return "?"


class Finding:
    def __init__(self, where: str, program: Program, result: Result, shrunk: Program, shrunk_result: Result):
        self.where, self.program, self.result = where, program, result
        self.shrunk, self.shrunk_result = shrunk, shrunk_result

    def key(self) -> str:
        """Failures deduplicated by cause as best a machine can: a crash by its message, a wrong value by
        the shrunk program's ops with names and numbers blotted out."""
        if self.result.status in ("crash", "timeout"):
            return self.shrunk_result.signature()
        ops = sorted(re.sub(r"\b[xv]\d+\b|\d+", "#", line) for op in self.shrunk.ops for line in op.lines)
        return "fail: " + " | ".join(ops)


def check_batch(programs: list, seeds: list, device: str, timeout: float):
    """Yields (seed, program, result) for each program of a batch judged as one compile; a failing
    batch is judged again program by program, so each failure points at one program."""
    batch = merged(programs)
    result = judge_program(batch, device, timeout)
    if result.status in ("pass", "skip") and len(programs) > 1 or len(programs) == 1:
        for s, p in zip(seeds, programs):
            yield s, p, result
        return
    if result.status == "fail":
        groups = set()
        for name in result.names:
            groups |= {i.group for i in batch.inputs if i.name == name}
            groups |= {o.group for o in batch.ops if o.out == name}
    else:
        groups = set(range(len(programs)))
    blamed = False
    for g, (s, p) in enumerate(zip(seeds, programs)):
        alone = judge_program(p, device, timeout) if g in groups else Result("pass")
        blamed |= alone.status not in ("pass", "skip")
        yield s, p, alone
    if not blamed:  # fails only together: the batch is the program
        yield seeds[0], batch, result


def write_findings(path: str, findings: list, header: str) -> None:
    parts = [f"# smelt fuzzer findings\n\n{header}\n"]
    for n, f in enumerate(findings, 1):
        msgs = "\n".join(f.shrunk_result.messages[:6]) or f.result.status
        parts.append(f"## {n}. {f.result.status}: {f.key()[:160]}\n\n{f.where}; shrunk from {len(f.program.ops)} ops to "
                     f"{len(f.shrunk.ops)}\n\n```\n{msgs}\n```\n\n```python\n{f.shrunk.source()}```\n")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def run(count: int, seed: int, device="cpu", backward=True, batch=4, every=50, out=None, shrink_budget=120.0,
        timeout=60.0, log=print) -> dict:
    backend = backend_name(device)
    start = time.monotonic()
    counts = {"pass": 0, "fail": 0, "crash": 0, "timeout": 0, "skip": 0}
    findings, keys = [], {}
    done = 0
    header = ""
    while done < count:
        size = min(batch, count - done)
        seeds = [program_seed(seed, done + k) for k in range(size)]
        programs = [generate(s, device, backward) for s in seeds]
        for s, p, result in check_batch(programs, seeds, device, timeout):
            if p not in programs:  # the batch itself, failing only as a whole
                where = f"batch of seeds {seeds} (no program fails alone)"
            else:
                counts[result.status] += 1
                where = f"generate({s}) (--seed {seed}, program {s - program_seed(seed, 0)})"
            if result.status in ("pass", "skip"):
                continue
            if result.status == "timeout":
                shrunk, shrunk_result, tried = p, result, 0
            else:
                shrunk, shrunk_result, tried = shrink(p, result, device, shrink_budget, timeout)
            finding = Finding(f"{where}, {backend}", p, result, shrunk, shrunk_result)
            key = finding.key()
            if key in keys:
                keys[key].where += f"; also {where}"
                log(f"  {result.status} at {where}: same as finding {findings.index(keys[key]) + 1}")
            else:
                keys[key] = finding
                findings.append(finding)
                log(f"  {result.status} at {where} (shrunk in {tried} tries):\n"
                    + "\n".join("    " + m for m in shrunk_result.messages[:3]))
            if out:
                header = (f"backend {backend}, commit {_commit()}, seed {seed}; {sum(counts.values())} programs so far "
                          f"({counts})")
                write_findings(out, findings, header)
        done += size
        if done % every < size or done == count:
            log(f"[{done}/{count}] {time.monotonic() - start:.0f} s: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    seconds = time.monotonic() - start
    if out:
        write_findings(out, findings, f"backend {backend}, commit {_commit()}, seed {seed}; {count} programs in "
                       f"{seconds:.0f} s ({counts})")
    return {"counts": counts, "findings": findings, "seconds": seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m smelt.tools.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", default=None, help="markdown file of findings, rewritten as each is found")
    ap.add_argument("--batch", type=int, default=4, help="independent programs compiled together")
    ap.add_argument("--every", type=int, default=50, help="programs between progress lines")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per program")
    ap.add_argument("--shrink-budget", type=float, default=120.0, help="seconds spent shrinking each failure")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    import smelt  # noqa: F401  (registers the backend)
    summary = run(args.count, args.seed, args.device, args.backward, args.batch, args.every, args.out,
                  args.shrink_budget, args.timeout, log=lambda s: print(s, flush=True))
    c = summary["counts"]
    failed = c["fail"] + c["crash"] + c["timeout"]
    print(f"\n{args.count} programs in {summary['seconds']:.0f} s ({backend_name(args.device)}): passed {c['pass']}, "
          f"failed {failed} (wrong values {c['fail']}, crashes {c['crash']}, timeouts {c['timeout']}), "
          f"skipped {c['skip']}")
    for n, f in enumerate(summary["findings"], 1):
        print(f"\n--- failure {n}: {f.where}\n" + "\n".join(f.shrunk_result.messages[:6]) + "\n" + f.shrunk.source())
    return 1 if failed else 0
