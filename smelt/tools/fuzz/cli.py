"""python -m smelt.tools.fuzz --count N --seed S [--device cpu|cuda] [--backward/--no-backward] [--out findings.md]
                            [--cuda-compile-check]

Runs N random programs (in batches of --batch independent programs, one compile each), prints a
progress line every --every programs, then a summary and each failure's shrunk program. Exit code 1
when any program failed. --cuda-compile-check (SMELT_CHECK_CUDA_COMPILE=1) also compiles every
kernel that Triton's interpreter runs for an H100 (sm_90), so a CPU run finds kernels the GPU compiler
refuses; with SMELT_CPU_BACKEND=triton that is every kernel."""
from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

from .generator import generate
from .journal import Journal
from .program import Program, merged
from .runner import CACHE_HITS, EVERY_PRODUCT_PADDED, PRECOMPILE, Result, judge_in_subprocess, judge_program
from .shrinker import shrink


def program_seed(seed: int, k: int) -> int:
    return seed * 1_000_003 + k


def backend_name(device: str) -> str:
    from smelt.config import setting
    if device.startswith("cuda"):
        return "cuda/" + setting("SMELT_CUDA_BACKEND")
    checked = " + CUDA compile check" if setting("SMELT_CHECK_CUDA_COMPILE") else ""
    return "cpu/" + setting("SMELT_CPU_BACKEND") + checked


def _commit() -> str:
    from smelt.config import setting
    if setting("SMELT_COMMIT"):  # a copy of the tree without its git folder
        return setting("SMELT_COMMIT")
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), timeout=5).stdout.strip() or "?"
    except Exception:
        return "?"


def finding_key(status: str, shrunk: Program, shrunk_result: Result) -> str:
    """Failures deduplicated by cause as best a machine can: a crash by its message, a wrong value by
    the shrunk program's ops with names and numbers blotted out."""
    if status != "fail":
        return shrunk_result.signature()
    ops = sorted(re.sub(r"\b[xv]\d+\b|\d+", "#", line) for op in shrunk.ops for line in op.lines)
    return "fail: " + " | ".join(ops)


def check_batch(programs: list, seeds: list, device: str, timeout: float):
    """Yields (seed, program, result) for each program of a batch judged as one compile; a failing
    batch is judged again program by program, so each failure points at one program."""
    batch = merged(programs)
    result = judge_program(batch, device, timeout)
    if result.status == "pass" or len(programs) == 1:
        for s, p in zip(seeds, programs):
            yield s, p, result
        return
    if result.status == "fail":
        groups = set()
        for name in result.names:
            groups |= {i.group for i in batch.inputs if i.name == name}
            groups |= {o.group for o in batch.ops if o.out == name}
    else:  # a crash, or a batch eager or Dynamo rejects: each program alone
        groups = set(range(len(programs)))
    blamed = False
    for g, (s, p) in enumerate(zip(seeds, programs)):
        alone = judge_program(p, device, timeout) if g in groups else Result("pass")
        blamed |= alone.status not in ("pass", "skip")
        yield s, p, alone
    if not blamed:  # fails only together: the batch is the program
        yield seeds[0], batch, result


def write_findings(path: str, journal: Journal, header: str) -> None:
    parts = [f"# smelt fuzzer findings\n\n{header}\n"]
    for n, f in enumerate(journal.findings, 1):
        msgs = "\n".join(f["messages"][:6]) or f["status"]
        parts.append(f"## {n}. {f['status']}: {f['key'][:160]}\n\n{f['where']}; shrunk from {f['ops_before']} ops to "
                     f"{f['ops_after']}\n\n```\n{msgs}\n```\n\n```python\n{f['source']}```\n")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


def _header(backend, seed, journal, seconds=None):
    c = journal.counts
    took = f" in {seconds:.0f} s" if seconds is not None else " so far"
    return f"backend {backend}, commit {_commit()}, seed {seed}; {sum(c.values())} programs{took} ({c})"


def run(count: int, seed: int, device="cpu", backward=True, batch=4, every=50, out=None, shrink_budget=120.0,
        timeout=60.0, skip=(), log=print, journal: Journal | None = None, stop: int | None = None) -> dict:
    """Judges programs 0..count-1 of `seed` (from where `journal` left off, up to `stop`), leaving out the
    indices in `skip` (known failures)."""
    backend = backend_name(device)
    start = time.monotonic()
    journal = journal or Journal(None)
    done = journal.next_index()
    end = count if stop is None else min(stop, count)
    try:  # a timed campaign ends with SIGINT (timeout -s INT): the findings file is still written
        while done < end:
            size = min(batch, end - done)
            indices = [done + k for k in range(size) if done + k not in skip]
            seeds = [program_seed(seed, k) for k in indices]
            programs = [generate(s, device, backward) for s in seeds]
            done += size
            for s, p, result in check_batch(programs, seeds, device, timeout):
                if p not in programs:  # the batch itself, failing only as a whole
                    where = f"batch of seeds {seeds} (no program fails alone)"
                else:
                    where = f"generate({s}) (--seed {seed}, program {indices[programs.index(p)]})"
                    journal.add({"index": indices[programs.index(p)], "status": result.status})
                if result.status in ("unsupported", "ill-conditioned"):
                    log(f"  {result.status} at {where}: " + " ".join(result.messages[0].splitlines()[:2])[:300])
                if result.status in ("pass", "skip", "unsupported", "ill-conditioned"):
                    continue
                if result.status == "timeout" or not shrink_budget:
                    shrunk, shrunk_result, tried = p, result, 0
                else:
                    shrunk, shrunk_result, tried = shrink(p, result, device, shrink_budget, timeout)
                key = finding_key(result.status, shrunk, shrunk_result)
                known = journal.find(key)
                if known:
                    journal.add({"also": key, "where": where})
                    log(f"  {result.status} at {where}: same as finding {journal.findings.index(known) + 1}")
                else:
                    journal.add({"finding": {"key": key, "status": result.status, "where": f"{where}, {backend}",
                                             "messages": shrunk_result.messages, "source": shrunk.source(device),
                                             "ops_before": len(p.ops), "ops_after": len(shrunk.ops)}})
                    log(f"  {result.status} at {where} (shrunk in {tried} tries):\n"
                        + "\n".join("    " + m for m in shrunk_result.messages[:3]))
                if out:
                    write_findings(out, journal, _header(backend, seed, journal))
            if done % every < size or done == count:
                log(f"[{done}/{count}] {time.monotonic() - start:.0f} s: "
                    + ", ".join(f"{k} {v}" for k, v in journal.counts.items()))
    except KeyboardInterrupt:
        log(f"interrupted after {done} programs: " + ", ".join(f"{k} {v}" for k, v in journal.counts.items()))
    seconds = time.monotonic() - start
    if out:
        write_findings(out, journal, _header(backend, seed, journal, seconds))
    return {"counts": journal.counts, "findings": journal.findings, "seconds": seconds}


def supervise(argv: list, args) -> int:
    """Runs the fuzzer in child processes. A child killed by a signal (a kernel that segfaults) is
    started again on that batch one program at a time, the program that kills it recorded as a
    'segfault' finding, and the run goes on after it."""
    journal_path = args.journal or (args.out + ".journal" if args.out else
                                    os.path.join(tempfile.gettempdir(), f"smelt_fuzz_{os.getpid()}.journal"))
    if not args.journal and os.path.exists(journal_path):
        os.remove(journal_path)
    base = [sys.executable, "-m", "smelt.tools.fuzz", *argv, "--in-process", "--journal", journal_path]
    isolate_until = None
    while True:
        journal = Journal(journal_path)
        at = journal.next_index()
        if at >= args.count:
            break
        cmd = base + (["--batch", "1", "--stop", str(isolate_until)] if isolate_until else [])
        child = subprocess.Popen(cmd)
        try:
            rc = child.wait()
        except KeyboardInterrupt:  # SIGINT reaches the child too: it stops and writes its journal
            child.wait()
            break
        if rc >= 0 and not isolate_until:
            break
        if rc >= 0:  # the isolated batch ran through: back to batches
            isolate_until = None
            continue
        journal = Journal(journal_path)
        at = journal.next_index()
        if isolate_until is None:
            isolate_until = at + args.batch
            print(f"  the process died (signal {-rc}) in the batch from program {at}: again one at a time", flush=True)
            continue
        s = program_seed(args.seed, at)
        where = f"generate({s}) (--seed {args.seed}, program {at})"
        if _dies_generating(s, args):  # eager itself crashed validating it: not smelt's
            print(f"  eager segfaults at {where}: skipped", flush=True)
            journal.add({"index": at, "status": "skip"})
            continue
        program = generate(s, args.device, args.backward)
        print(f"  segfault at {where} (signal {-rc}), shrinking in fresh processes", flush=True)
        shrunk, shrunk_result, tried = shrink(program, Result("segfault"), args.device, 3 * args.shrink_budget,
                                              args.timeout, judge=judge_in_subprocess)
        journal.add({"index": at, "status": "segfault"})
        key = finding_key("segfault", shrunk, shrunk_result) + " " + " | ".join(
            sorted(re.sub(r"\b[xv]\d+\b|\d+", "#", line) for op in shrunk.ops for line in op.lines))
        if journal.find(key):
            journal.add({"also": key, "where": where})
        else:
            journal.add({"finding": {"key": key, "status": "segfault", "where": f"{where}, {backend_name(args.device)}",
                                     "messages": [f"the process died by signal {-rc} (shrunk in {tried} fresh processes)"],
                                     "source": shrunk.source(args.device), "ops_before": len(program.ops),
                                     "ops_after": len(shrunk.ops)}})
    journal = Journal(journal_path)
    if args.out:
        write_findings(args.out, journal, _header(backend_name(args.device), args.seed, journal))
    return _summary(args, journal, None)


def _dies_generating(seed: int, args) -> bool:
    code = f"from smelt.tools.fuzz.generator import generate; generate({seed}, {args.device!r}, {args.backward})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode < 0


def _summary(args, journal: Journal, seconds) -> int:
    c = journal.counts
    failed = sum(c[k] for k in ("fail", "crash", "timeout", "segfault", "refused"))
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    print(f"\n{sum(c.values())} programs{took} ({backend_name(args.device)}): passed {c['pass']}, failed {failed} "
          f"(wrong values {c['fail']}, crashes {c['crash']}, segfaults {c['segfault']}, timeouts {c['timeout']}, "
          f"Halide refusals {c['refused']}), "
          f"skipped {c['skip']} (eager raised), unsupported {c['unsupported']} (torch.compile raised without smelt too), "
          f"ill-conditioned {c['ill-conditioned']} (the float64 answer moves under a 1e-9 rescaling of the inputs)")
    for n, f in enumerate(journal.findings, 1):
        print(f"\n--- failure {n}: {f['where']}\n" + "\n".join(f["messages"][:6]) + "\n" + f["source"])
    return 1 if failed else 0


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
    ap.add_argument("--cuda-compile-check", action="store_true",
                    help="also compile interpreted Triton kernels for sm_90 (sets SMELT_CHECK_CUDA_COMPILE=1)")
    ap.add_argument("--cache-hits", action="store_true",
                    help="judge each program's second compile, served by the graph cache (a fresh folder)")
    ap.add_argument("--precompile", action="store_true",
                    help="judge each program saved by torch's precompile (aot_compile) and loaded again")
    ap.add_argument("--host-scalar-args", action="store_true",
                    help="CPU scalar inputs as Triton kernel arguments in CPU graphs too, as GPU graphs take them "
                         "(sets SMELT_HOST_SCALAR_ARGS=on; with SMELT_CPU_BACKEND=triton)")
    ap.add_argument("--layouts", action="store_true",
                    help="channels-last convolutions, padded matrix products and depthwise convolutions as kernels "
                         "(forward and backward) in every program, however small (sets SMELT_CHANNELS_LAST=on, "
                         "SMELT_MATMUL_PADDING=on and SMELT_DEPTHWISE_KERNELS=on): passes the sizes keep out otherwise")
    ap.add_argument("--small-products", action="store_true",
                    help="1x1 convolutions of few multiply-adds as reductions on every backend (sets "
                         "SMELT_SMALL_PRODUCTS=on; Triton's interpreter has them by default, Halide not)")
    ap.add_argument("--in-process", action="store_true",
                    help="run here, without a supervising process (a segfault then ends the run)")
    ap.add_argument("--journal", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    if args.cuda_compile_check:  # read per compile; the judging and shrinking subprocesses inherit it
        os.environ["SMELT_CHECK_CUDA_COMPILE"] = "1"
    if args.host_scalar_args:
        os.environ["SMELT_HOST_SCALAR_ARGS"] = "on"
    if args.small_products:
        os.environ["SMELT_SMALL_PRODUCTS"] = "on"
    if args.layouts:
        os.environ.update({"SMELT_CHANNELS_LAST": "on", "SMELT_MATMUL_PADDING": "on", "SMELT_DEPTHWISE_KERNELS": "on",
                           EVERY_PRODUCT_PADDED: "1"})
    if args.precompile:
        from smelt import precompile
        if not precompile.available():
            import torch
            ap.error(f"--precompile: torch {torch.__version__} has no precompile (torch.compile(...).aot_compile)")
        os.environ[PRECOMPILE] = "1"
    if args.cache_hits and not os.environ.get(CACHE_HITS):  # the supervised children inherit all three
        os.environ.update({CACHE_HITS: "1", "SMELT_GRAPH_CACHE": "1",
                           "SMELT_CACHE_DIR": tempfile.mkdtemp(prefix="smelt-fuzz-cache-")})
    warnings.filterwarnings("ignore")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    import smelt  # noqa: F401  (registers the backend)
    if not args.in_process:
        return supervise(argv, args)
    journal = Journal(args.journal)
    summary = run(args.count, args.seed, args.device, args.backward, args.batch, args.every, args.out,
                  args.shrink_budget, args.timeout, log=lambda s: print(s, flush=True), journal=journal,
                  stop=args.stop)
    if args.journal:  # a supervised child: the supervisor prints the summary
        return 0
    return _summary(args, journal, summary["seconds"])
