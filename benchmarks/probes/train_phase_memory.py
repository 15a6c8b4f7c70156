"""A training step's memory on the CPU, phase by phase, smelt against Inductor (issue 22): for the
forward, the backward and the optimizer step, each profiled alone, the allocator's peak over what it
held when the phase began and what the phase left allocated; the step's peak is the largest of
(what earlier phases left + this phase's peak).

    python -m benchmarks.probes.train_phase_memory [--models qwen2] [--size real] [--batch 2] [--seq 128]

A whole step profiled at once gave Inductor's qwen2 456 MiB against these 600 (RESULTS 2026-11-27,
seventh session), a difference not explained yet, so the phases are measured apart.
"""
from __future__ import annotations

import argparse
import functools
import os

import torch

from .cpu_peak_memory import allocations_of


def measure(name: str, size: str, batch: int, seq: int, backend: str) -> None:
    from smelt.tools.model_suite import zoo_text
    from smelt.tools.model_suite.spec import seeded
    from smelt.tools.model_suite.timing import build_model
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[name]
    zoo_text.BATCH[size], zoo_text.SEQ[size] = batch, seq
    torch._dynamo.reset()
    model = build_model(spec, size, 0).train()
    sample = spec.sample(size, generator=seeded(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = torch.compile(functools.partial(spec.loss, model), backend=backend)
    step = torch.compile(opt.step, backend=backend)
    for _ in range(2):  # compiled, and the optimizer's state made
        opt.zero_grad(set_to_none=True)
        loss_fn(sample).backward()
        step()
    opt.zero_grad(set_to_none=True)
    loss, forward_peak, forward_net = allocations_of(lambda: loss_fn(sample))
    _, backward_peak, backward_net = allocations_of(loss.backward)
    _, step_peak, _ = allocations_of(step)
    mib = 2 ** 20
    total = max(forward_peak, forward_net + backward_peak, forward_net + backward_net + step_peak)
    print(f"{name} {backend}: forward peak {forward_peak / mib:.1f} MiB (leaves {forward_net / mib:.1f}), "
          f"backward peak {backward_peak / mib:.1f} (leaves {backward_net / mib:.1f}), step peak "
          f"{step_peak / mib:.1f}; the step's peak {total / mib:.1f} MiB", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--backends", default="smelt,inductor")
    args = parser.parse_args(argv)
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    import smelt  # noqa: F401
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            measure(name, args.size, args.batch, args.seq, backend)


if __name__ == "__main__":
    main()
