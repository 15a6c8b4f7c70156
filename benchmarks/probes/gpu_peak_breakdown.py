"""What is alive at a CUDA step's peak, by the line that allocated it (issue 22: peak memory).

One warmed step of a model-suite case runs under the caching allocator's history; its allocations
and frees are replayed to find the peak, and the blocks alive there are grouped by the deepest frame
in generated code (smelt's wrapper, Inductor's output code) or else the deepest Python frame, with
their sizes. The figures are over what was allocated before the step (parameters, optimizer state).

    python -m benchmarks.probes.gpu_peak_breakdown qwen2 --mode train [--backends smelt,inductor] [--top 12]
        [--detail] [--save-sources DIR]
"""
from __future__ import annotations

import argparse
import collections
import os

import torch


SOURCES: set[str] = set()  # the generated files named at a peak, for --save-sources


def _site(frames) -> str:
    for frame in frames:
        name = frame.get("filename", "")
        if "smelt_graph" in name or "torchinductor" in name or "/tmp" in name or "wrapper" in name:
            SOURCES.add(name)
            return f"{os.path.basename(name)}:{frame.get('line')} {frame.get('name')}"
    for frame in frames:
        name = frame.get("filename", "")
        if name.endswith(".py") and "torch/" not in name:
            return f"{os.path.basename(name)}:{frame.get('line')} {frame.get('name')}"
    return "(no Python frame)"


def breakdown(step, top: int, detail: bool = False) -> None:
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    peak_site = ""
    for event in events:
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = (event["size"], _site(event.get("frames", [])))
            current += event["size"]
            if current > peak:
                peak, at_peak, peak_site = current, dict(live), live[event["addr"]][1]
        elif action == "free_completed":
            # A block from before the step counts too: a decode step frees each layer's old cache
            # as it makes the new one, and a replay that skipped those frees put eager's peak at
            # the whole cache's (2026-12-02).
            current -= live.pop(event["addr"])[0] if event["addr"] in live else event["size"]
    mib = 2 ** 20
    print(f"  before the step {base / mib:.1f} MiB; the step's peak {peak / mib:.1f} MiB over it", flush=True)
    by_site = collections.Counter()
    counts = collections.Counter()
    for size, site in at_peak.values():
        by_site[site] += size
        counts[site] += 1
    for site, size in by_site.most_common(top):
        print(f"    {size / mib:9.1f} MiB  x{counts[site]:<4d} {site}", flush=True)
    # Two compilers' peaks differ by a few blocks among hundreds: these sums say in which file
    # (forward or backward wrapper, autograd's Python) and which block sizes the difference lies.
    print(f"  the allocation that set the peak: {peak_site}")
    by_file, by_size = collections.Counter(), collections.Counter()
    for size, site in at_peak.values():
        by_file[site.split(":")[0]] += size
        by_size[size] += 1
    print("  by file: " + ", ".join(f"{name} {size / mib:.1f} MiB" for name, size in by_file.most_common(6)))
    print("  by block size (MiB x count): " + ", ".join(
        f"{size / mib:.2f} x{count}" for size, count in sorted(by_size.items(), reverse=True)[:16]), flush=True)
    if detail:  # every block of 1 MiB or more alive at the peak, in allocation order
        for size, site in at_peak.values():
            if size >= mib:
                print(f"    {size / mib:8.2f} MiB  {site}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--backends", default="smelt,inductor",
                        help="comma-separated; 'none' is plain eager, 'eager' is Dynamo alone")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--detail", action="store_true", help="list every block of 1 MiB or more alive at the peak")
    parser.add_argument("--save-sources", help="copy the generated files named at the peaks into this folder")
    args = parser.parse_args(argv)
    import smelt  # noqa: F401
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[args.model]
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        step = case_callable(spec, args.mode, "real", "cuda", 0, None if backend == "none" else backend)
        step()
        step()
        print(f"{args.model} {args.mode} {backend}:", flush=True)
        breakdown(step, args.top, args.detail)
        del step
        torch.cuda.empty_cache()
    if args.save_sources:
        import shutil
        os.makedirs(args.save_sources, exist_ok=True)
        for name in sorted(SOURCES):
            if os.path.isfile(name):
                shutil.copy(name, os.path.join(args.save_sources, os.path.basename(name)))


if __name__ == "__main__":
    main()
