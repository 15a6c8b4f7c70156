"""The Triton kernels of smelt::depthwise_weight_gradient (depthwise_weight_gradient.py).

d weight[c, 0, kh, kw] = sum over n, oh, ow of grad[n, c, oh, ow] * x[n, c, oh*sh - ph + kh, ow*sw - pw + kw]

A program takes a block of channels and a run of output rows (n, oh). For each strip of BW outputs
of a row it loads the gradient once, [BW, BC], and the input under every tap at once, [TAPS, BW, BC]:
neighbouring taps read neighbouring elements, so those loads come from L1, and the gradient and the
input leave memory about once. Each tap's sums stay in registers as a [TAPS, BC] tile; the program
writes them as its partial sums, and a second kernel adds the partials of every run in a fixed order
(no atomics: the result is the same each call) and casts them to the weight's dtype.

Channels-last operands are the case this is for: a position's BC channels are one contiguous read.
The channel stride must be 1 (the caller copies other layouts).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def depthwise_weight_gradient_partials(grad_ptr, x_ptr, partials_ptr, C_VEC, H, W, OH, OW, ROWS, rows_per_run,
                                       gs_n, gs_h, gs_w, xs_n, xs_h, xs_w,
                                       KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                                       PH: tl.constexpr, PW: tl.constexpr, TAPS: tl.constexpr,
                                       BW: tl.constexpr, BC: tl.constexpr, VEC: tl.constexpr):
    # The channel count and the strides come divided by VEC, a power of two dividing them all, and are
    # multiplied back here: the compiler then knows each position's BC channels start VEC-aligned
    # and the channel mask is constant over VEC lanes, so it loads them in vectors (it assumes
    # nothing of 72, MobileNetV3's channels, and loaded them element by element).
    C = C_VEC * VEC
    run = tl.program_id(1)
    c = tl.program_id(0) * BC + tl.arange(0, BC)
    c_ok = c < C
    tap = tl.arange(0, TAPS)
    tap_ok = tap < KH * KW
    kh = tap // KW
    kw = tap % KW
    # Summed over BW once, at the end: a sum across the tile at each step cost more than the loads.
    acc = tl.full([TAPS, BW, BC], 0.0, tl.float32)
    first = run * rows_per_run
    last = tl.minimum(first + rows_per_run, ROWS)
    for row in range(first, last):
        # Offsets in int64: one image of a large operand passes 2**31 elements.
        n = (row // OH).to(tl.int64)
        oh = (row % OH).to(tl.int64)
        ih = oh * SH - PH + kh  # [TAPS]
        row_ok = tap_ok & (ih >= 0) & (ih < H)
        grad_row = grad_ptr + (n * gs_n + oh * gs_h) * VEC
        x_rows = x_ptr + (n * xs_n + ih * xs_h) * VEC  # [TAPS]
        for ow0 in range(0, OW, BW):
            ow = ow0 + tl.arange(0, BW)
            ow_ok = ow < OW
            g = tl.load(grad_row + (ow.to(tl.int64) * gs_w * VEC)[:, None] + c[None, :],
                        mask=ow_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)  # [BW, BC]
            iw = ow[None, :] * SW - PW + kw[:, None]  # [TAPS, BW]
            inside = row_ok[:, None] & ow_ok[None, :] & (iw >= 0) & (iw < W)
            xv = tl.load(x_rows[:, None, None] + (iw.to(tl.int64) * xs_w * VEC)[:, :, None] + c[None, None, :],
                         mask=inside[:, :, None] & c_ok[None, None, :], other=0.0).to(tl.float32)
            acc += xv * g[None, :, :]
    total = tl.reduce(acc, 1, tl.standard._sum_combine)  # tl.sum: a @jit helper the interpreter cannot call
    out = partials_ptr + run.to(tl.int64) * (KH * KW) * C + tap[:, None] * C + c[None, :]
    tl.store(out, total, mask=tap_ok[:, None] & c_ok[None, :])


@triton.jit
def depthwise_weight_gradient_finish(partials_ptr, out_ptr, C, RUNS, TAP_COUNT: tl.constexpr,
                                     RB: tl.constexpr, BLOCK: tl.constexpr):
    # out[c, 0, tap] = the sum over runs of partials[run, tap, c], rounded once to out's dtype; RB
    # runs a step (one run a step left a program of hundreds of runs waiting on each load in turn).
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # over the [taps, C] partials of one run
    ok = i < TAP_COUNT * C
    acc = tl.full([RB, BLOCK], 0.0, tl.float32)
    for run0 in range(0, RUNS, RB):
        run = run0 + tl.arange(0, RB)
        acc += tl.load(partials_ptr + run[:, None] * (TAP_COUNT * C) + i[None, :],
                       mask=(run < RUNS)[:, None] & ok[None, :], other=0.0)
    total = tl.reduce(acc, 0, tl.standard._sum_combine)
    tap = i // C
    c = i % C
    tl.store(out_ptr + c * TAP_COUNT + tap, total.to(out_ptr.dtype.element_ty), mask=ok)
