"""An experiment against smelt's depthwise weight-gradient kernel (smelt/runtime/depthwise_weight_gradient.py):
one window row a program. The kept kernel holds every tap of a window in one [TAPS, BW, BC] tile, its
taps padded to a power of two (a 3x3 window takes 16 lanes, 7 of them masked) and 150-odd registers a
thread. Here a program takes one window row kh and holds [KWP, BW, BC] (KWP: KW padded, 4 for a 3x3
window), a quarter of the tile: more programs fit a multiprocessor, and the KH programs of a run read the
same gradient rows at about the same time, from L2. Partial sums land where the kept kernel puts them,
so its finish kernel adds them.

    python -m benchmarks.probes.depthwise_weight_gradient_rows efficientnet mobilenetv3 [--batch 32]
    python -m benchmarks.probes.depthwise_weight_gradient_rows --check-cpu   # values in Triton's interpreter
"""
from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl


# Near the kept kernel's body on purpose (the duplicates tool pairs them): an experiment to time
# against it, folded into it only if it wins.
@triton.jit
def window_row_partials(grad_ptr, x_ptr, partials_ptr, C_VEC, H, W, OH, OW, ROWS, rows_per_run,
                        gs_n, gs_h, gs_w, xs_n, xs_h, xs_w,
                        KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                        PH: tl.constexpr, PW: tl.constexpr, KWP: tl.constexpr,
                        BW: tl.constexpr, BC: tl.constexpr, VEC: tl.constexpr):
    C = C_VEC * VEC
    run = tl.program_id(1)
    kh = tl.program_id(2)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    c_ok = c < C
    kw = tl.arange(0, KWP)
    kw_ok = kw < KW
    acc = tl.full([KWP, BW, BC], 0.0, tl.float32)
    first = run * rows_per_run
    last = tl.minimum(first + rows_per_run, ROWS)
    for row in range(first, last):
        n = (row // OH).to(tl.int64)
        oh = (row % OH).to(tl.int64)
        ih = oh * SH - PH + kh
        if (ih >= 0) & (ih < H):
            grad_row = grad_ptr + (n * gs_n + oh * gs_h) * VEC
            x_row = x_ptr + (n * xs_n + ih * xs_h) * VEC
            for ow0 in range(0, OW, BW):
                ow = ow0 + tl.arange(0, BW)
                ow_ok = ow < OW
                g = tl.load(grad_row + (ow.to(tl.int64) * gs_w * VEC)[:, None] + c[None, :],
                            mask=ow_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)  # [BW, BC]
                iw = ow[None, :] * SW - PW + kw[:, None]  # [KWP, BW]
                inside = kw_ok[:, None] & ow_ok[None, :] & (iw >= 0) & (iw < W)
                xv = tl.load(x_row + (iw.to(tl.int64) * xs_w * VEC)[:, :, None] + c[None, None, :],
                             mask=inside[:, :, None] & c_ok[None, None, :], other=0.0).to(tl.float32)
                acc += xv * g[None, :, :]
    total = tl.reduce(acc, 1, tl.standard._sum_combine)  # [KWP, BC]
    tap = kh * KW + kw
    out = partials_ptr + run.to(tl.int64) * (KH * KW) * C + tap[:, None] * C + c[None, :]
    tl.store(out, total, mask=kw_ok[:, None] & c_ok[None, :])


SWEEP = ((32, 16, 4), (64, 8, 4), (64, 16, 4), (64, 32, 8), (128, 8, 8))


def run_rows(grad, x, kernel_size, stride, padding, dtype, bc: int, bw: int, warps: int, runs: int):
    from smelt.runtime import depthwise_weight_gradient as dwg
    n, c, h, w = x.shape
    oh, ow = grad.shape[2:]
    kh, kw = kernel_size
    rows = n * oh
    rows_per_run = triton.cdiv(rows, runs)
    runs = triton.cdiv(rows, rows_per_run)
    strides = [*(grad.stride(i) for i in (0, 2, 3)), *(x.stride(i) for i in (0, 2, 3))]
    vec = dwg.vector_width(c, strides)
    partials = torch.empty((runs, kh * kw, c), dtype=torch.float32, device=x.device)
    out = torch.empty((c, 1, kh, kw), dtype=dtype, device=x.device)
    kernels = dwg._kernels(x.device)
    partials_kernel = window_row_partials
    if x.device.type != "cuda":
        from smelt.runtime.loader import load_module
        partials_kernel = load_module(__file__, interpret=True).window_row_partials
    partials_kernel[(triton.cdiv(c, bc), runs, kh)](
        grad, x, partials, c // vec, h, w, oh, ow, rows, rows_per_run, *(s // vec for s in strides),
        KH=kh, KW=kw, SH=stride[0], SW=stride[1], PH=padding[0], PW=padding[1], KWP=triton.next_power_of_2(kw),
        BW=bw, BC=bc, VEC=vec, num_warps=warps)
    kernels.depthwise_weight_gradient_finish[(triton.cdiv(kh * kw * c, 32),)](
        partials, out, c, runs, TAP_COUNT=kh * kw, RB=64, BLOCK=32, num_warps=4)
    return out


def _reference(grad, x, weight_shape, s, p):
    c = x.shape[1]
    w = torch.zeros(weight_shape, dtype=torch.float64, device=x.device)
    return torch.ops.aten.convolution_backward(grad.double(), x.double(), w, None, [s, s], [p, p], [1, 1], False,
                                               [0, 0], c, [False, True, False])[1]


def check_cpu() -> None:
    """Values against float64 on small shapes through Triton's interpreter: 3x3 and 5x5 windows, strides
    1 and 2, channel counts that 8 divides and that it does not, several runs."""
    torch.manual_seed(0)
    for c, size, k, s, runs in ((24, 9, 3, 1, 3), (20, 10, 5, 2, 4), (16, 7, 3, 2, 1), (40, 6, 5, 1, 5)):
        p = k // 2
        x = torch.randn(2, c, size, size).to(memory_format=torch.channels_last)
        weight = torch.randn(c, 1, k, k)
        out = torch.nn.functional.conv2d(x, weight, stride=s, padding=p, groups=c)
        grad = torch.randn_like(out).contiguous(memory_format=torch.channels_last)
        got = run_rows(grad, x, [k, k], [s, s], [p, p], torch.float32, bc=16, bw=4, warps=4, runs=runs)
        ref = _reference(grad, x, (c, 1, k, k), s, p)
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
        print(f"  ({c}, {size}, {k}, {s}) runs {runs}: matches float64")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--check-cpu", action="store_true")
    args = parser.parse_args()
    if args.check_cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        check_cpu()
        return
    from benchmarks.probes.depthwise_weight_gradient import depthwise_layers, gpu_us, layer_case
    from smelt.runtime.depthwise_weight_gradient import choose_blocks, run
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model_name in args.models:
        totals = [0.0, 0.0, 0.0]
        print(f"\n{model_name}, batch {args.batch}, bf16 channels-last: (C, H, W, k, stride, pad) cuDNN us / "
              f"kept kernel us / one window row a program, best of a sweep us (BC x BW, warps, runs)")
        for c, h, w, k, s, p in depthwise_layers(model_name):
            x, _, out, grad, cudnn, ref = layer_case(args.batch, c, h, w, k, s, p)
            scale = ref.abs().max().item()
            cudnn_us = gpu_us(cudnn, flush)
            kept_us = gpu_us(lambda: run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16), flush)
            chosen = choose_blocks(c, out.shape[3], args.batch * out.shape[2], k * k, sms)
            best = (float("inf"), None)
            kwp = triton.next_power_of_2(k)
            # A few blocks only: each new one is a Triton compile per window shape.
            for bc, bw, warps in SWEEP:
                if kwp * bw * bc > 8192 or bc > max(16, triton.next_power_of_2(c)):
                    continue
                runs = chosen.runs
                got = run_rows(grad, x, [k, k], [s, s], [p, p], torch.bfloat16, bc, bw, warps, runs)
                if (got.double() - ref).abs().max().item() / scale > 2e-2:
                    raise AssertionError(f"window rows wrong at {(c, h, w, k, s, p)} {bc}x{bw} {warps}w")
                us = gpu_us(lambda: run_rows(grad, x, [k, k], [s, s], [p, p], torch.bfloat16, bc, bw, warps, runs),
                            flush, calls=7)
                if us < best[0]:
                    best = (us, (bc, bw, warps, runs))
            totals[0] += cudnn_us
            totals[1] += kept_us
            totals[2] += best[0]
            bc, bw, warps, runs = best[1]
            print(f"  ({c}, {h}, {w}, {k}, {s}, {p})  {cudnn_us:7.1f} / {kept_us:7.1f} / {best[0]:7.1f} "
                  f"({bc}x{bw}, {warps}w, {runs} runs)")
        print(f"  total: cuDNN {totals[0]:.1f} us, kept kernel {totals[1]:.1f} us, window rows {totals[2]:.1f} us")


if __name__ == "__main__":
    main()
