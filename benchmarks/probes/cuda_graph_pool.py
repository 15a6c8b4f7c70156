"""The shared CUDA graph pool's size against its recordings' outputs, step by step, on a training
loop of layers that each break the graph (the loop tests/gpu/test_cuda_graphs.py checks): what
giving outputs' memory back to the pool saves (runtime/graph_pool.py; each recording kept its outputs
for good before, so the pool held them all). Also per graph the recordings made and kept.

    python -m benchmarks.probes.cuda_graph_pool [--layers 4] [--dim 1024] [--batch 4096] [--steps 8]
"""
from __future__ import annotations

import argparse

import torch

import smelt
from smelt.runtime import cuda_graphs, graph_pool

MIB = 2 ** 20


class BrokenBlock(torch.nn.Module):
    """A layer whose forward breaks the graph: every layer calls the same two compiled graphs, each
    with its own parameters (Whisper's layers under transformers do)."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        torch._dynamo.graph_break()
        return x + y * 2


def outputs_bytes() -> int:
    """Bytes of the kept shared recordings' outputs, each storage once."""
    return cuda_graphs.output_bytes(r for g in smelt.observe.compiled_graphs() for sizes in g.call.sizes.values()
                                    for r in sizes.recordings if r.shared)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[BrokenBlock(args.dim) for _ in range(args.layers)]).cuda()
    compiled = torch.compile(model, backend="smelt", mode="reduce-overhead")
    for step in range(args.steps):
        out = compiled(torch.randn(args.batch, args.dim, device="cuda"))
        out.sum().backward()
        for p in model.parameters():
            p.grad = None
        del out
        graphs = smelt.observe.compiled_graphs()
        pool = sum(p.view.size() for p in cuda_graphs._pools.values())
        print(f"step {step}: shared pool {pool / MIB:.1f} MiB, kept recordings' outputs {outputs_bytes() / MIB:.1f} MiB; "
              f"recordings made {[g.call.recorded for g in graphs]}, kept "
              f"{[sum(len(s.recordings) for s in g.call.sizes.values()) for g in graphs]}, in pools of their own "
              f"{sum(not r.shared for g in graphs for s in g.call.sizes.values() for r in s.recordings)}; "
              f"pools retired {len(graph_pool.retirements)}", flush=True)


if __name__ == "__main__":
    main()
