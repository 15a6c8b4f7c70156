"""smelt's depthwise weight gradient (smelt/runtime/depthwise_weight_gradient.py) against cuDNN's, layer
by layer over a model's depthwise convolutions (bf16, channels-last, the AMP training step's shapes):
GPU time queued behind a sleep with L2 flushed before each call, the chosen blocks and the best of a sweep,
and the values checked against a float64 reference.

    python -m benchmarks.probes.depthwise_weight_gradient efficientnet mobilenetv3 [--batch 32] [--sweep]
    python -m benchmarks.probes.depthwise_weight_gradient --host   # smelt's own host time a call (any machine)
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from smelt.runtime import depthwise_weight_gradient as dwg
from smelt.runtime.depthwise_weight_gradient import Blocks, choose_blocks, run
from smelt.tools.model_suite.zoo import all_specs


@triton.jit
def pipelined_partials(grad_ptr, x_ptr, partials_ptr, C_VEC, H, W, OH, OW, ROWS, rows_per_run, STRIPS,
                       gs_n, gs_h, gs_w, xs_n, xs_h, xs_w,
                       KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                       PH: tl.constexpr, PW: tl.constexpr, TAPS: tl.constexpr,
                       BW: tl.constexpr, BC: tl.constexpr, VEC: tl.constexpr, STAGES: tl.constexpr):
    # A copy of the kept kernel's body on purpose (the duplicates tool pairs them): an experiment to
    # time against it, folded into the kernel only if it wins.
    # The kept kernel's work as one loop over (row, strip) steps, which Triton's pipeliner may run
    # STAGES deep (the kept kernel's inner loop over a 7- or 14-wide row has one step).
    C = C_VEC * VEC
    run = tl.program_id(1)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    c_ok = c < C
    tap = tl.arange(0, TAPS)
    tap_ok = tap < KH * KW
    kh = tap // KW
    kw = tap % KW
    acc = tl.full([TAPS, BW, BC], 0.0, tl.float32)
    first = run * rows_per_run
    last = tl.minimum(first + rows_per_run, ROWS)
    for step in tl.range(first * STRIPS, last * STRIPS, num_stages=STAGES):
        row = step // STRIPS
        ow0 = (step % STRIPS) * BW
        n = (row // OH).to(tl.int64)
        oh = (row % OH).to(tl.int64)
        ih = oh * SH - PH + kh
        row_ok = tap_ok & (ih >= 0) & (ih < H)
        ow = ow0 + tl.arange(0, BW)
        ow_ok = ow < OW
        g = tl.load(grad_ptr + (n * gs_n + oh * gs_h) * VEC + (ow * gs_w * VEC)[:, None] + c[None, :],
                    mask=ow_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        iw = ow[None, :] * SW - PW + kw[:, None]
        inside = row_ok[:, None] & ow_ok[None, :] & (iw >= 0) & (iw < W)
        at = (n * xs_n + ih * xs_h)[:, None] * VEC + iw.to(tl.int64) * xs_w * VEC
        xv = tl.load(x_ptr + at[:, :, None] + c[None, None, :],
                     mask=inside[:, :, None] & c_ok[None, None, :], other=0.0).to(tl.float32)
        acc += xv * g[None, :, :]
    total = tl.reduce(acc, 1, tl.standard._sum_combine)
    out = partials_ptr + run * (KH * KW) * C + tap[:, None] * C + c[None, :]
    tl.store(out, total, mask=tap_ok[:, None] & c_ok[None, :])


def run_pipelined(grad, x, kernel_size, stride, padding, dtype, blocks: Blocks, stages: int):
    """The kept kernel's steps through pipelined_partials, then the kept finish kernel."""
    n, c, h, w = x.shape
    oh, ow = grad.shape[2:]
    kh, kw = kernel_size
    rows = n * oh
    rows_per_run = triton.cdiv(rows, blocks.runs)
    runs = triton.cdiv(rows, rows_per_run)
    strides = [*(grad.stride(i) for i in (0, 2, 3)), *(x.stride(i) for i in (0, 2, 3))]
    vec = dwg.vector_width(c, strides)
    partials = torch.empty((runs, kh * kw, c), dtype=torch.float32, device=x.device)
    out = torch.empty((c, 1, kh, kw), dtype=dtype, device=x.device)
    kernels = dwg._kernels(x.device)
    pipelined_partials[(triton.cdiv(c, blocks.channels), runs)](
        grad, x, partials, c // vec, h, w, oh, ow, rows, rows_per_run, triton.cdiv(ow, blocks.outputs),
        *(s // vec for s in strides), KH=kh, KW=kw, SH=stride[0], SW=stride[1], PH=padding[0], PW=padding[1],
        TAPS=triton.next_power_of_2(kh * kw), BW=blocks.outputs, BC=blocks.channels, VEC=vec, STAGES=stages,
        num_warps=blocks.warps)
    kernels.depthwise_weight_gradient_finish[(triton.cdiv(kh * kw * c, 32),)](
        partials, out, c, runs, TAP_COUNT=kh * kw, RB=64, BLOCK=32, num_warps=4)
    return out


def depthwise_layers(model_name: str) -> list[tuple]:
    """(channels, H, W, kernel, stride, padding) of each distinct depthwise convolution at 224x224."""
    model = all_specs()[model_name].build("real").eval()
    found = []

    def hook(module, inputs, output):
        x = inputs[0]
        key = (module.in_channels, x.shape[2], x.shape[3], module.kernel_size[0], module.stride[0], module.padding[0])
        if key not in found:
            found.append(key)
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d) and m.groups == m.in_channels > 1 and m.out_channels == m.in_channels:
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    return found


def layer_case(batch: int, c: int, h: int, w: int, k: int, s: int, p: int):
    """A layer's bf16 channels-last input, weight, output and output gradient on the GPU, cuDNN's
    weight gradient as a call, and the float64 reference gradient."""
    x = torch.randn(batch, c, h, w, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16)
    out = torch.nn.functional.conv2d(x, weight, stride=s, padding=p, groups=c)
    grad = torch.randn_like(out).contiguous(memory_format=torch.channels_last)

    def weight_gradient(*tensors):
        return torch.ops.aten.convolution_backward(*tensors, None, [s, s], [p, p], [1, 1], False, [0, 0], c,
                                                   [False, True, False])[1]
    ref = weight_gradient(grad.double(), x.double(), weight.double())
    return x, weight, out, grad, lambda: weight_gradient(grad, x, weight), ref


def gpu_us(fn, flush: torch.Tensor, calls: int = 15) -> float:
    """Median over calls of fn's GPU time, L2 flushed before each (as in a model, where a layer's
    gradient and input were written long before): the calls are queued behind a sleeping kernel,
    so the host's launch time is not in the events' span."""
    from smelt.runtime.autotune import _cycles_per_ms
    fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda._sleep(int(_cycles_per_ms() * 20))  # 20 ms: longer than queueing the calls takes
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(1000 * start.elapsed_time(end) for start, end in events)
    return times[calls // 2]


def host_us(calls: int = 2000) -> float:
    """Microseconds of smelt's own work in a call of run() (EfficientNet's 5x5 stride-2 layer on the
    CPU), its two launches replaced by no-ops: what is left of a call's host time is Triton's launch."""
    import time

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    class Kernels:
        depthwise_weight_gradient_partials = depthwise_weight_gradient_finish = NoLaunch()
    real = dwg._kernels
    dwg._kernels = lambda device: Kernels
    try:
        x = torch.randn(32, 144, 56, 56).to(memory_format=torch.channels_last)
        grad = torch.randn(32, 144, 28, 28).to(memory_format=torch.channels_last)
        for _ in range(100):
            run(grad, x, [5, 5], [2, 2], [2, 2], torch.bfloat16)
        start = time.perf_counter()
        for _ in range(calls):
            run(grad, x, [5, 5], [2, 2], [2, 2], torch.bfloat16)
        return (time.perf_counter() - start) / calls * 1e6
    finally:
        dwg._kernels = real


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*")
    parser.add_argument("--host", action="store_true", help="smelt's own host time a call of run(), and stop")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--pipelined", action="store_true", help="also the one-loop form at 1-3 stages")
    args = parser.parse_args()
    if args.host:
        print(f"smelt's own part of run(): {host_us():.1f} us a call")
        return
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model_name in args.models:
        totals = [0.0, 0.0, 0.0]
        totals_pipelined = [0.0, 0.0, 0.0]
        print(f"\n{model_name}, batch {args.batch}, bf16 channels-last: (C, H, W, k, stride, pad) "
              f"cuDNN us / smelt us (chosen blocks) / best of sweep us (blocks); max error against float64 "
              f"(cuDNN's, smelt's)")
        for c, h, w, k, s, p in depthwise_layers(model_name):
            x, _, out, grad, cudnn, ref = layer_case(args.batch, c, h, w, k, s, p)
            chosen = choose_blocks(c, out.shape[3], args.batch * out.shape[2], k * k, sms)
            mine = run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16)
            scale = ref.abs().max().item()
            errors = ((cudnn().double() - ref).abs().max().item() / scale, (mine.double() - ref).abs().max().item() / scale)
            cudnn_us = gpu_us(cudnn, flush)
            mine_us = gpu_us(lambda: run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16), flush)
            best = (mine_us, chosen)
            if args.sweep:
                taps = triton.next_power_of_2(k * k)
                for bc, bw, warps, runs_scale in itertools.product((16, 32, 64, 128), (1, 2, 4, 8, 16), (4, 8), (1, 2)):
                    if taps * bw * bc > 8192 or bc > max(16, triton.next_power_of_2(c)) or (bc == 16 and c >= 32):
                        continue
                    blocks = Blocks(bc, bw, warps, max(1, int(chosen.runs * runs_scale)))
                    us = gpu_us(lambda: run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16, blocks), flush, calls=7)
                    if us < best[0]:
                        best = (us, blocks)
            if args.pipelined:
                timed = []
                for stages in (1, 2, 3):
                    got = run_pipelined(grad, x, [k, k], [s, s], [p, p], torch.bfloat16, chosen, stages)
                    torch.testing.assert_close(got.float(), mine.float(), rtol=2e-2, atol=1e-2)
                    timed.append(gpu_us(lambda: run_pipelined(grad, x, [k, k], [s, s], [p, p], torch.bfloat16,
                                                              chosen, stages), flush))
                    totals_pipelined[stages - 1] += timed[-1]
                print(f"  one loop, 1/2/3 stages: " + " / ".join(f"{t:.1f}" for t in timed))
            totals[0] += cudnn_us
            totals[1] += mine_us
            totals[2] += best[0]
            b = best[1]
            print(f"  ({c}, {h}, {w}, {k}, {s}, {p})  {cudnn_us:7.1f} / {mine_us:7.1f} ({chosen.channels}x{chosen.outputs}, "
                  f"{chosen.warps}w, {chosen.runs} runs) / {best[0]:7.1f} ({b.channels}x{b.outputs}, {b.warps}w, "
                  f"{b.runs} runs)   errors {errors[0]:.1e} {errors[1]:.1e}")
        print(f"  total: cuDNN {totals[0]:.1f} us, smelt {totals[1]:.1f} us, best of sweep {totals[2]:.1f} us")
        if args.pipelined:
            print("  total, one loop at 1/2/3 stages: " + " / ".join(f"{t:.1f}" for t in totals_pipelined))


if __name__ == "__main__":
    main()
