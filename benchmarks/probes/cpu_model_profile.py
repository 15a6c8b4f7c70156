"""Where a small model's inference time goes on the CPU under smelt (issue 23): eager, Inductor's C++
backend and smelt (median of 15 calls each, one process), then one profiled call of smelt's: the time
in smelt's Halide kernels, in ATen ops (their own time), and the rest of the call (Python between them),
averaged over --calls profiled calls after one that warms the profiler.

    python -m benchmarks.probes.cpu_model_profile [bert llama mobilenetv3 resnet18] [--no-inductor] [--top N]

--top N also lists the N costliest Halide kernels of the profiled call, and the N costliest ATen
ops by input shapes (a weight's conversion inside a convolution shows as aten::copy_ of its shape).

Thread settings come from the environment (OMP_WAIT_POLICY, HL_NUM_THREADS, ...): run it once per
setting to compare them.
"""
from __future__ import annotations

import argparse
import time

import torch

import smelt.observe
from benchmarks.cpu_models import build
from benchmarks.measure import median_call_ms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["bert", "llama", "mobilenetv3"])
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--calls", type=int, default=5, help="profiled calls averaged, after one the profiler warms on")
    args = parser.parse_args(argv)
    print(f"threads: torch {torch.get_num_threads()}")
    for name in args.models:
        torch.manual_seed(0)
        model, inputs = build(name)
        with torch.no_grad():
            eager = median_call_ms(model, inputs, 15, warmup=3)
            inductor = None
            if not args.no_inductor:
                torch._dynamo.reset()
                inductor = median_call_ms(torch.compile(model), inputs, 15, warmup=3)
            torch._dynamo.reset()
            smelt.observe.reset()
            compiled = torch.compile(model, backend="smelt")
            ours = median_call_ms(compiled, inputs, 15, warmup=3)
            kernels = {k for g in smelt.observe.compiled_graphs() for k in g.kernel_names}
            # The profiler's first recorded call carries its own start-up (the first kernel took 6 ms
            # of mobilenetv3's 24 so): one call warms it, the next `--calls` are averaged.
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=args.calls, repeat=1)
            with torch.profiler.profile(record_shapes=bool(args.top), schedule=schedule) as profile:
                compiled(*inputs)
                profile.step()
                start = time.perf_counter()
                for _ in range(args.calls):
                    compiled(*inputs)
                    profile.step()
                wall = (time.perf_counter() - start) * 1e6 / args.calls
        in_kernels = in_aten = 0.0
        aten_ops: dict[str, float] = {}
        for event in profile.key_averages():
            if event.key in kernels:
                in_kernels += event.self_cpu_time_total / args.calls
            elif event.key.startswith("aten::"):
                in_aten += event.self_cpu_time_total / args.calls
                aten_ops[event.key] = event.self_cpu_time_total / args.calls
        top = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(aten_ops.items(), key=lambda kv: -kv[1])[:4])
        print(f"{name}: eager {eager:.2f} ms, inductor {inductor and f'{inductor:.2f}'} ms, smelt {ours:.2f} ms "
              f"({eager / ours:.2f}x eager); a profiled smelt call {wall / 1e3:.2f} ms: {len(kernels)} kernels "
              f"{in_kernels / 1e3:.2f} ms, ATen {in_aten / 1e3:.2f} ms (top: {top}), the rest "
              f"{(wall - in_kernels - in_aten) / 1e3:.2f} ms", flush=True)
        if args.top:
            _print_top(profile, kernels, args.top, args.calls)


def _print_top(profile, kernels, top: int, calls: int) -> None:
    """Per call: the costliest kernels, then ATen ops by input shapes."""
    ours = sorted((e for e in profile.key_averages() if e.key in kernels), key=lambda e: -e.self_cpu_time_total)
    for e in ours[:top]:
        print(f"    {e.self_cpu_time_total / calls:9.1f} us  {e.key}")
    aten = sorted((e for e in profile.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")),
                  key=lambda e: -e.self_cpu_time_total)
    for e in aten[:top]:
        print(f"    {e.self_cpu_time_total / calls:9.1f} us  {e.key} x{e.count // calls} {str(e.input_shapes)[:100]}")


if __name__ == "__main__":
    main()
