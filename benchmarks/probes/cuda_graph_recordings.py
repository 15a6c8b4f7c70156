"""How smelt's CUDA graphs serve a model suite case under mode="reduce-overhead" (issue 22): the
wall time of each of a few steps, then per compiled graph its replays, recordings made, recordings
kept per sizes and why it ran without a graph, if it did. Whisper's AMP training step on the H200
re-recorded its per-layer graphs at every call (16 recordings a step, 46 ms a step against 23
without graphs), which this showed.

    python -m benchmarks.probes.cuda_graph_recordings whisper --mode train [--steps 8]
"""
from __future__ import annotations

import argparse
import logging
import time

import torch

import smelt.runtime.cuda_graphs as cuda_graphs
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    calls = []
    made = cuda_graphs.GraphedCall.__init__

    def remembered(self, *a, **kw):
        made(self, *a, **kw)
        calls.append(self)
    cuda_graphs.GraphedCall.__init__ = remembered
    step = case_callable(all_specs()[args.model], args.mode, "real", "cuda", 0, "smelt", "reduce-overhead")
    for i in range(args.steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"step {i}: {1e3 * (time.perf_counter() - start):.1f} ms", flush=True)
    for call in calls:
        kept = {str(key): len(sizes.recordings) for key, sizes in call.sizes.items()}
        print(f"{call.name}: {call.replays} replays, {call.recorded} recordings made, kept {kept}"
              + (f", without a graph: {call.blocked}" if call.blocked else ""))


if __name__ == "__main__":
    main()
