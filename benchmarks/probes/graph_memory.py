"""Where a model's reserved GPU memory lies with CUDA graphs on (issue 22: MobileNetV3's and
ResNet-50's reserved peaks with graphs were 1.49x and 1.33x Inductor's reduce-overhead while their
peaks without graphs are even). For each backend, as the model suite measures it (four calls, the
caches emptied), every segment the caching allocator still holds: its pool, stream, size and the
bytes live in it, and the largest live blocks with the Python frame that allocated them.

    python -m benchmarks.probes.graph_memory mobilenetv3 resnet50 [--backends smelt-ro,inductor-ro]
"""
from __future__ import annotations

import argparse
import collections
import gc

import torch

from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs

MiB = 2 ** 20


def _frame(block: dict) -> str:
    """The innermost frame of the allocation's stack outside torch itself, else the innermost."""
    frames = block.get("frames") or []
    for f in frames:
        name = f.get("filename", "")
        if "/torch/" not in name and name:
            return f"{'/'.join(name.rsplit('/', 2)[-2:])}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename', '?')}:{frames[0].get('line')}" if frames else "(no frames)"


def show(label: str) -> None:
    segments = torch.cuda.memory_snapshot()
    by_pool = collections.defaultdict(lambda: [0, 0, 0])
    live = []
    for seg in segments:
        key = (str(seg.get("segment_pool_id")), seg.get("stream"), seg.get("segment_type"))
        by_pool[key][0] += 1
        by_pool[key][1] += seg["total_size"]
        by_pool[key][2] += seg["allocated_size"]
        live += [b for b in seg["blocks"] if b["state"] == "active_allocated"]
    print(f"{label}: reserved {torch.cuda.memory_reserved() / MiB:.1f} MiB, "
          f"allocated {torch.cuda.memory_allocated() / MiB:.1f} MiB")
    for (pool, stream, kind), (n, total, used) in sorted(by_pool.items(), key=lambda kv: -kv[1][1]):
        print(f"  pool {pool} stream {stream} {kind}: {n} segments, {total / MiB:.1f} MiB, {used / MiB:.1f} live")
    for b in sorted(live, key=lambda b: -b["size"])[:12]:
        print(f"    live {b['size'] / MiB:7.2f} MiB  {_frame(b)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--backends", default="smelt-ro,inductor-ro")
    args = parser.parse_args()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    for name in args.models:
        spec = all_specs()[name]
        for backend in args.backends.split(","):
            torch._dynamo.reset()
            gc.collect()
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_reserved()
            graphed = backend.endswith("-ro")
            fn = case_callable(spec, args.mode, "real", "cuda", 0, backend.removesuffix("-ro"),
                               "reduce-overhead" if graphed else None)
            for _ in range(4):
                fn()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            print(f"\n{name} {args.mode} {backend}: peak reserved above base "
                  f"{(torch.cuda.max_memory_reserved() - base) / MiB:.1f} MiB (base {base / MiB:.1f})")
            show("after a steady call")
            del fn
            gc.collect()


if __name__ == "__main__":
    main()
