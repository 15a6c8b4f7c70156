"""A training step's memory, phase by phase, smelt against Inductor (issue 22): for the forward, the
backward and the optimizer step, each measured alone, the allocator's peak over what it held when the
phase began and what the phase left allocated; the step's peak is the largest of (what earlier phases
left + this phase's peak). On the CPU the profiler's allocation events count it (float32, no AMP); on
CUDA the caching allocator's own statistics do, under the model suite's AMP bfloat16.

    python -m benchmarks.probes.train_phase_memory [--models qwen2] [--size real] [--batch 2] [--seq 128]
    python -m benchmarks.probes.train_phase_memory --device cuda   # the suite's batch and length
    python -m benchmarks.probes.train_phase_memory --models vit --batch 4 --autocast   # CPU bf16 autocast,
        # standing in for the suite's CUDA AMP (the CPU's autocast op lists differ a little)

A whole step profiled at once gave Inductor's qwen2 456 MiB against these 600 (RESULTS 2026-11-27,
seventh session), a difference not explained yet, so the phases are measured apart.
"""
from __future__ import annotations

import argparse
import functools
import os

import torch



def cuda_allocations_of(fn) -> tuple:
    """(fn's result, the peak over the level before the call, bytes left allocated), from the
    CUDA caching allocator's statistics."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base


def measure(name: str, size: str, batch, seq, backend: str, device: str, cpu_autocast: bool = False) -> None:
    from smelt.tools.model_suite import zoo_text, zoo_vision
    from smelt.tools.model_suite.spec import autocast_for, seeded
    from smelt.tools.model_suite.timing import build_model
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[name]
    if batch is not None:
        zoo_text.BATCH[size] = zoo_vision.BATCH[size] = batch
    if seq is not None:
        zoo_text.SEQ[size] = seq
    torch._dynamo.reset()
    model = build_model(spec, size, 0).to(device).train()
    sample = spec.sample(size, generator=seeded(0)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    loss_fn = torch.compile(functools.partial(spec.loss, model), backend=backend)
    step = torch.compile(opt.step, backend=backend)

    def forward():
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if cpu_autocast else autocast_for(device)
        with amp:
            return loss_fn(sample)
    for _ in range(2):  # compiled, and the optimizer's state made
        opt.zero_grad(set_to_none=True)
        forward().backward()
        step()
    opt.zero_grad(set_to_none=True)
    if torch.device(device).type == "cuda":
        loss, forward_peak, forward_net = cuda_allocations_of(forward)
        _, backward_peak, backward_net = cuda_allocations_of(loss.backward)
        _, step_peak, _ = cuda_allocations_of(step)
    else:
        (forward_peak, forward_net), (backward_peak, backward_net), (step_peak, _) = cpu_phases(
            [forward, lambda loss: loss.backward(), lambda _: step()])
    mib = 2 ** 20
    total = max(forward_peak, forward_net + backward_peak, forward_net + backward_net + step_peak)
    print(f"{name} {backend}: forward peak {forward_peak / mib:.1f} MiB (leaves {forward_net / mib:.1f}), "
          f"backward peak {backward_peak / mib:.1f} (leaves {backward_net / mib:.1f}), step peak "
          f"{step_peak / mib:.1f}; the step's peak {total / mib:.1f} MiB", flush=True)


def cpu_phases(phases) -> list[tuple[int, int]]:
    """(peak over the level at its start, bytes it leaves) of each phase, run one after another
    (each given the last one's result) under one profiler: the profiler reports a block's free only
    if it saw the block allocated, so a backward profiled alone would not see the saved activations
    it frees. An allocation of a size no model makes marks where each phase begins."""
    from torch.profiler import ProfilerActivity, profile

    from .cpu_peak_memory import allocation_events
    marker = 123457
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = None
        for k, phase in enumerate(phases):
            torch.empty(marker + k, dtype=torch.uint8)
            result = phase() if k == 0 else phase(result)
        torch.empty(marker + len(phases), dtype=torch.uint8)
    figures, current, start, peak, phase = [], 0, 0, 0, -1
    for _, size, _, _ in allocation_events(prof):
        if marker <= size <= marker + len(phases):
            if phase >= 0:
                figures.append((peak - start, current - start))
            phase, start, peak = size - marker, current, current
            continue
        if marker <= -size <= marker + len(phases):
            continue  # a marker freed
        current += size
        peak = max(peak, current)
    return figures


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=None, help="default: 2 on the CPU, the suite's on CUDA")
    parser.add_argument("--seq", type=int, default=None, help="default: 128 on the CPU, the suite's on CUDA")
    parser.add_argument("--backends", default="smelt,inductor")
    parser.add_argument("--autocast", action="store_true", help="on the CPU: bfloat16 autocast")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        args.batch, args.seq = args.batch or 2, args.seq or 128
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    # The CPU workspace's block is allocated once and kept: a phase's call-local buffers would not show
    # in its allocation events, where the GPU's would.
    os.environ.setdefault("SMELT_CPU_WORKSPACE", "0")
    import smelt  # noqa: F401
    for name in args.models.split(","):
        for backend in args.backends.split(","):
            measure(name, args.size, args.batch, args.seq, backend, args.device, args.autocast and args.device == "cpu")


if __name__ == "__main__":
    main()
