"""How smelt's CUDA graphs serve a model suite case under mode="reduce-overhead" (issue 22): the
wall time of each of a few steps, then per compiled graph its replays, recordings made, recordings
kept per sizes and why it ran without a graph, if it did. Whisper's AMP training step on the H200
re-recorded its per-layer graphs at every call (16 recordings a step, 46 ms a step against 23
without graphs), which this showed. With --memory, each step's peak and what stays allocated after
it, against eager's step, then one more step's after torch.cuda.empty_cache() (the suite's measure), and per graph the bytes of its kept recordings' outputs (their memory goes
back to the shared pool when they die: runtime/graph_pool.py) and of the inputs they copy in. A
recording's outputs are not the allocator's: compare reserved memory.

    python -m benchmarks.probes.cuda_graph_recordings whisper --mode train [--steps 8] [--memory]
"""
from __future__ import annotations

import argparse
import logging
import time

import torch

import smelt.runtime.cuda_graphs as cuda_graphs
import smelt.runtime.graph_pool as graph_pool
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--backend", default="smelt", help="smelt, or inductor for its reduce-overhead steps")
    parser.add_argument("--why", action="store_true",
                        help="print each recording as it is made with why the graph's kept ones did not fit "
                             "(moved: an input read in place is elsewhere; held / others held: outputs), and the "
                             "recordings made per graph after each step")
    args = parser.parse_args()
    spec = all_specs()[args.model]
    if args.memory:
        eager = case_callable(spec, args.mode, "real", "cuda", 0, None, None)
        eager()
        _step_memory("eager", eager)
        del eager
        torch.cuda.empty_cache()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.why:
        runtime_log = logging.getLogger("smelt.runtime")
        runtime_log.setLevel(logging.DEBUG)
        runtime_log.addFilter(lambda record: " records (" in record.getMessage())
    calls = []
    made = cuda_graphs.GraphedCall.__init__

    def remembered(self, *a, **kw):
        made(self, *a, **kw)
        calls.append(self)
    cuda_graphs.GraphedCall.__init__ = remembered
    step = case_callable(spec, args.mode, "real", "cuda", 0, args.backend, "reduce-overhead")
    for i in range(args.steps):
        if args.memory:
            _step_memory(f"step {i}", step)
            continue
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"step {i}: {1e3 * (time.perf_counter() - start):.1f} ms"
              + (f"; recordings made {[c.recorded for c in calls]}" if args.why else ""), flush=True)
    if args.memory:
        # What the warm-up and recording steps left cached outside the pools counts in their reserved
        # peaks; the suite's figure (and Inductor's) is a step's after empty_cache.
        torch.cuda.empty_cache()
        _step_memory("a step after empty_cache", step)
        print(_private_pools())
    totals = [0, 0]
    for call in calls:
        kept = {str(key): len(sizes.recordings) for key, sizes in call.sizes.items()}
        recordings = [r for sizes in call.sizes.values() for r in sizes.recordings]
        outputs, copied = _held_bytes(recordings)
        totals[0] += outputs
        totals[1] += copied
        private = sum(not r.shared for r in recordings)
        print(f"{call.name}: {call.replays} replays, {call.recorded} recordings made, kept {kept}"
              + (f" ({private} in pools of their own)" if private else "")
              + (f", outputs {outputs / MIB:.1f} MiB, copied inputs {copied / MIB:.1f} MiB" if args.memory else "")
              + (f", without a graph: {call.blocked}" if call.blocked else ""))
    if args.memory:
        print(f"kept recordings hold {totals[0] / MIB:.1f} MiB of outputs, {totals[1] / MIB:.1f} MiB of copied inputs; "
              f"recordings whose outputs may be held: {sum(len(p.handed_out) for p in cuda_graphs._pools.values())}; "
              f"pools retired: {len(graph_pool.retirements)} {graph_pool.retirements[:3]}; "
              f"shared pools {_pool_bytes() / MIB:.1f} MiB; reserved {torch.cuda.memory_reserved() / MIB:.1f} MiB")


MIB = 2 ** 20


def _step_memory(label, step) -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    print(f"{label}: {1e3 * (time.perf_counter() - start):.1f} ms, allocated before {before / MIB:.1f} MiB, "
          f"peak {torch.cuda.max_memory_allocated() / MIB:.1f} (+{(torch.cuda.max_memory_allocated() - before) / MIB:.1f}), "
          f"after {torch.cuda.memory_allocated() / MIB:.1f} MiB; reserved peak {torch.cuda.max_memory_reserved() / MIB:.1f} MiB",
          flush=True)


def _private_pools() -> str:
    """Every private pool's segments (CUDA graphs' memory, smelt's or Inductor's): how much of it is
    in use between steps, and its largest free block (fragmentation against the step's needs)."""
    pools: dict = {}
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id") or ())
        if not pool or pool == (0, 0):
            continue
        entry = pools.setdefault(pool, [0, 0, 0, 0])
        entry[0] += seg["total_size"]
        entry[1] += seg["allocated_size"]
        entry[2] += 1
        entry[3] = max([entry[3]] + [b["size"] for b in seg["blocks"] if b["state"] == "inactive"])
    return "private pools: " + ("; ".join(
        f"{pool}: {total / MIB:.1f} MiB in {count} segments, {used / MIB:.1f} MiB allocated, largest free block "
        f"{free / MIB:.1f} MiB" for pool, (total, used, count, free) in pools.items()) or "none")


def _pool_bytes() -> int:
    return sum(p.view.size() for p in cuda_graphs._pools.values())


def _held_bytes(recordings) -> tuple[int, int]:
    """Bytes of the recordings' outputs (each storage once) and of the inputs they copy in."""
    copied = sum(i.buffer().untyped_storage().nbytes() for r in recordings for i in r.copied or ())
    return cuda_graphs.output_bytes(recordings), copied


if __name__ == "__main__":
    main()
