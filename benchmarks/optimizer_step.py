"""An Adam step over ~150 tensors of mixed sizes (issue 6): eager, Inductor and smelt.

    python3 -m benchmarks.optimizer_step [--small] [--device cuda] [--foreach 1] [--clip 1.0] [--tensor-lr]

Parameters: a few 16M-element matrices, dozens of 4k vectors and about a hundred tiny tensors,
fp32, each with a gradient. Each backend gets its own copy (same seed) and its own optimizer; the
compiled step is checked against eager's after two steps, then timed with do_bench (each call is a
real step: the parameters keep moving, which does not change the work). The floor is Adam's
bytes: parameter, gradient and both moments read, parameter and moments written (28 bytes an
element in fp32), over the measured copy bandwidth. With --clip, the step first clips the
gradients' total norm (`clip_grad_norm_`), which reads each gradient for its norm and writes it
scaled: 36 bytes an element. With --tensor-lr the learning rate is a 0-d CPU tensor, as PyTorch
advises for compiled optimizers driven by a scheduler (no recompile when it changes); Adam then takes
its per-tensor path (foreach does not take a tensor rate without capturable). Kernel launches per step are counted with the profiler; compile
seconds are the first call's.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

# Kineto detaches CUPTI when a profile ends only when asked: otherwise every later launch in the
# process costs more (eager's clipped step: 2.3-3.1 ms before launches_per_step, 3.6-5.4 after).
os.environ.setdefault("TEARDOWN_CUPTI", "1")

import torch  # noqa: E402

from benchmarks.backends import compile_fn, preload
from benchmarks.measure import bench_ms, copy_bandwidth, synchronize


def shapes(small: bool) -> list[tuple[int, ...]]:
    if small:
        return [(256, 256)] * 4 + [(64,)] * 40 + [(3,)] * 100
    return [(4096, 4096)] * 4 + [(4096,)] * 40 + [(7,)] * 100


def make(device: str, small: bool, foreach: bool, tensor_lr: bool = False):
    torch.manual_seed(0)
    params = [torch.randn(s, device=device, requires_grad=True) for s in shapes(small)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    if tensor_lr:
        return params, torch.optim.Adam(params, lr=torch.tensor(1e-3))
    return params, torch.optim.Adam(params, lr=1e-3, foreach=foreach)


def make_step(device: str, small: bool, foreach: bool, clip: float | None, tensor_lr: bool = False):
    """(parameters, the eager step): Adam's, after clipping the gradients' norm to `clip` if given."""
    params, opt = make(device, small, foreach, tensor_lr)
    if clip is None:
        return params, opt.step

    def clipped_step():
        torch.nn.utils.clip_grad_norm_(params, clip, foreach=foreach)
        opt.step()

    return params, clipped_step


def launches_per_step(step, device: str) -> int | str:
    if not device.startswith("cuda"):
        return "—"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def host_ms_per_step(step, device: str) -> float:
    """Host time to issue one step, in bursts short enough that the GPU queue never fills: when
    it is above the GPU time, the step is host-bound."""
    times = []
    for _ in range(10):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(4):
            step()
        times.append((time.perf_counter() - start) / 4 * 1e3)
    synchronize(device)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--foreach", type=int, default=1)
    parser.add_argument("--clip", type=float, default=None, help="clip the gradients' total norm to this first")
    parser.add_argument("--tensor-lr", action="store_true", help="the learning rate as a 0-d CPU tensor")
    parser.add_argument("--backends", default="eager,inductor,smelt")
    parser.add_argument("--compile-time", action="store_true",
                        help="also cold and warm first-call seconds, each in a fresh process (Dynamo alone too)")
    parser.add_argument("--combo-blocks", default=None,
                        help="smelt's combo block shapes to compare, e.g. 1024x4,4096x8 (XBLOCK x warps)")
    parser.add_argument("--autotune", action="store_true",
                        help="also smelt with SMELT_AUTOTUNE=1 (combos timed as a whole on the first call)")
    args = parser.parse_args()
    numel = sum(torch.Size(s).numel() for s in shapes(args.small))
    floor_bytes = (28 if args.clip is None else 36) * numel
    bw = copy_bandwidth(args.device)
    reference, ref_step = make_step(args.device, args.small, bool(args.foreach), args.clip, args.tensor_lr)
    for _ in range(2):
        ref_step()
    rows = []
    runs = []
    for backend in args.backends.split(","):
        if backend == "smelt" and args.combo_blocks:
            runs += [("smelt", shape) for shape in args.combo_blocks.split(",")]
        else:
            runs.append((backend, None))
        if backend == "smelt" and args.autotune:
            runs.append(("smelt", "autotuned"))
    for backend, shape in runs:
        label = backend if shape is None else f"smelt, combo blocks {shape}"
        if shape == "autotuned":
            label = "smelt, autotuned (first call tunes)"
            os.environ["SMELT_AUTOTUNE"] = "1"
            os.environ["SMELT_GRAPH_CACHE"] = "0"
            os.environ["SMELT_CACHE_DIR"] = tempfile.mkdtemp(prefix="smelt_autotune_")  # nothing chosen yet
        elif shape is not None:
            os.environ["SMELT_GRAPH_CACHE"] = "0"  # each shape compiles anew
            from smelt.codegen.triton import combo as triton_combo
            xblock, warps = (int(v) for v in shape.split("x"))
            triton_combo.POINTWISE_CONFIG = triton_combo.BlockConfig(xblock, None, warps, False)
        params, eager_step = make_step(args.device, args.small, bool(args.foreach), args.clip, args.tensor_lr)
        preload(backend) if backend != "eager" else None
        step = eager_step if backend == "eager" else compile_fn(backend, eager_step)
        synchronize(args.device)
        start = time.perf_counter()
        step()
        synchronize(args.device)
        first = time.perf_counter() - start
        step()
        error = max(float((p - q).abs().max()) for p, q in zip(params, reference))
        launches = launches_per_step(step, args.device)
        ms = bench_ms(step, args.device)
        host = host_ms_per_step(step, args.device)
        rows.append((label, ms, floor_bytes / (ms * 1e-3) / bw, launches, first, error, host))
        del params, eager_step, step
        torch._dynamo.reset()
    clipped = "" if args.clip is None else f", gradients clipped to norm {args.clip}"
    clipped += ", learning rate a 0-d CPU tensor (per-tensor Adam)" if args.tensor_lr else ""
    print(f"\n### Adam step{clipped}, {len(shapes(args.small))} tensors, {numel / 1e6:.1f}M elements fp32 "
          f"(floor {floor_bytes / 1e6:.0f} MB; copy BW {bw / 1e9:.0f} GB/s; foreach={bool(args.foreach) and not args.tensor_lr})\n")
    print("| backend | ms | % of floor | host ms per step | launches per step | first call s | max abs diff vs eager |")
    print("|---|---|---|---|---|---|---|")
    for backend, ms, share, launches, first, error, host in rows:
        print(f"| {backend} | {ms:.4f} | {share:.0%} | {host:.3f} | {launches} | {first:.2f} | {error:.1e} |")
    if args.compile_time:
        from benchmarks.compile_time import ADAM_STEP, cold_and_warm
        print("\n| backend | first call in a fresh process, cold s | warm s (same cache dirs) |\n|---|---|---|")
        for backend in [b for b in args.backends.split(",") if b != "eager"] + ["dynamo"]:
            cold, warm = cold_and_warm(backend, ADAM_STEP, args.device, args.small, timeout=300.0)
            show = lambda v: f"{v:.2f}" if isinstance(v, float) else v  # noqa: E731
            print(f"| {'Dynamo alone (eager backend)' if backend == 'dynamo' else backend} | {show(cold)} | {show(warm)} |")


if __name__ == "__main__":
    main()
