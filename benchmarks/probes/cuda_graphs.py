"""Launch-bound calls with and without CUDA graphs: a stack of small transformer-style layers at
batch 1 (one token: every kernel is tiny, so a call costs its host time), inference and a training
step. Per call wall time (median of do_bench) for eager, Inductor, Inductor mode="reduce-overhead",
smelt and smelt mode="reduce-overhead", in one process.

    python -m benchmarks.probes.cuda_graphs [--layers 8] [--dim 512]
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

import smelt  # noqa: F401  (registers the backend)


class Layer(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def model(layers, dim):
    return torch.nn.Sequential(*[Layer(dim) for _ in range(layers)]).cuda()


def timed(name, make, steps):
    torch._dynamo.reset()
    fn = make()
    for _ in range(3):  # compile, warm up, record
        fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, return_mode="median")
    print(f"{name:22s} {steps:10s} {ms * 1e3:9.1f} us", flush=True)
    return ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(1, 1, args.dim, device="cuda")
    results = {}
    for backend, mode in ((None, None), ("inductor", None), ("inductor", "reduce-overhead"),
                          ("smelt", None), ("smelt", "reduce-overhead")):
        name = "eager" if backend is None else backend + (f" {mode}" if mode else "")

        def infer():
            m = model(args.layers, args.dim).eval()
            f = m if backend is None else torch.compile(m, backend=backend, mode=mode)

            def call():
                with torch.no_grad():
                    f(x)
            return call

        def train():
            m = model(args.layers, args.dim)
            opt = torch.optim.SGD(m.parameters(), lr=1e-3)
            loss = (lambda: m(x).square().mean()) if backend is None else \
                torch.compile(lambda: m(x).square().mean(), backend=backend, mode=mode)

            def step():
                opt.zero_grad(set_to_none=True)
                loss().backward()
                opt.step()
            return step

        results[name] = (timed(name, infer, "inference"), timed(name, train, "train"))
    print()
    print("| | inference us | train step us |")
    print("| --- | --- | --- |")
    for name, (i, t) in results.items():
        print(f"| {name} | {i * 1e3:.1f} | {t * 1e3:.1f} |")


if __name__ == "__main__":
    main()
