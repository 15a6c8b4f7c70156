"""What ordering a graph's writes into its inputs costs at compile time (lowering/input_writes.py):
an Adam step (foreach=False) over N parameters, compiled on the CPU, each parameter's update, moments
and step count written back (4 writes a parameter); the seconds `run_input_writes` spends outside
the writes it registers, the `lower` stage, and the step against eager's.

    python -m benchmarks.probes.input_write_order [--params 200]
"""
from __future__ import annotations

import argparse
import time

import torch

import smelt.lowering.graph as lowering_graph
from smelt import compile_stages


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=200)
    args = parser.parse_args(argv)
    spent = {"all": 0.0, "writes": 0.0, "count": 0}
    order = lowering_graph.run_input_writes

    def timed(graph, writes):
        for w in writes:
            def run(source, inner=w.run):
                start = time.perf_counter()
                inner(source)
                spent["writes"] += time.perf_counter() - start
            w.run = run
        start = time.perf_counter()
        order(graph, writes)
        spent["all"] += time.perf_counter() - start
        spent["count"] += len(writes)
    lowering_graph.run_input_writes = timed

    torch.manual_seed(0)
    shapes = [(64 + (k % 7) * 8, 32 + k % 5) if k % 3 else (128 + k,) for k in range(args.params)]
    ours = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    eager = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, eager):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    step = torch.compile(torch.optim.Adam(ours, lr=0.01, foreach=False).step, backend="smelt")
    reference = torch.optim.Adam(eager, lr=0.01, foreach=False)
    with torch.no_grad():
        step()
    reference.step()
    worst = max((p - q).abs().max().item() for p, q in zip(ours, eager))
    print(f"{args.params} parameters, {spent['count']} input writes: ordering {spent['all'] - spent['writes']:.3f} s "
          f"outside the writes; lower stage {compile_stages.totals['lower']:.2f} s; largest difference from eager "
          f"{worst:.1e}")


if __name__ == "__main__":
    main()
