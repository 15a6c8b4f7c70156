"""Two forms of a 5x5 depthwise convolution kernel (channels-last, bf16), written by hand: the taps
unrolled, as smelt's lowering emits them (lowering/depthwise_convolution.py), and the window as a
reduction over its taps (one masked [XBLOCK, 32] load and a sum). Their sm_90 build time, which
needs no GPU (`triton.compile` for an explicit GPUTarget), and on a GPU their run time against
cuDNN's channels-last call, with their values checked against it (issue 24: the unrolled form's
builds were the longest of MobileNetV3's cold compile).

    python -m benchmarks.probes.depthwise_forms [--channels 672] [--size 14] [--batch 32]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

TAPS = 25


@triton.jit
def unrolled(x_ptr, w_ptr, out_ptr, numel, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr, XBLOCK: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = idx < numel
    c, col, row, n = idx % C, (idx // C) % W, (idx // (C * W)) % H, idx // (C * W * H)
    acc = tl.zeros([XBLOCK], tl.float32)
    for i in tl.static_range(5):
        for j in tl.static_range(5):
            r, s = row + i - 2, col + j - 2
            inside = mask & (r >= 0) & (r < H) & (s >= 0) & (s < W)
            v = tl.load(x_ptr + ((n * H + r) * W + s) * C + c, inside, other=0.0).to(tl.float32)
            acc += v * tl.load(w_ptr + c * 25 + i * 5 + j, mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + idx, acc.to(tl.bfloat16), mask)


@triton.jit
def as_reduction(x_ptr, w_ptr, out_ptr, numel, H: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
                 XBLOCK: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    tap = tl.arange(0, 32)[None, :]
    mask = idx < numel
    c, col, row, n = idx % C, (idx // C) % W, (idx // (C * W)) % H, idx // (C * W * H)
    r, s = row + tap // 5 - 2, col + tap % 5 - 2
    inside = mask & (tap < 25) & (r >= 0) & (r < H) & (s >= 0) & (s < W)
    v = tl.load(x_ptr + ((n * H + r) * W + s) * C + c, inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c * 25 + tap, mask & (tap < 25), other=0.0).to(tl.float32)
    total = tl.sum(v * w, 1)
    tl.store(out_ptr + tl.reshape(idx, [XBLOCK]), total.to(tl.bfloat16), tl.reshape(mask, [XBLOCK]))


FORMS = {"unrolled": (unrolled, 256), "as_reduction": (as_reduction, 64)}


def build_seconds(fn, xblock: int, size: int, channels: int) -> float:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "numel": "i32", "H": "constexpr",
                 "W": "constexpr", "C": "constexpr", "XBLOCK": "constexpr"}
    source = ASTSource(fn, signature, constexprs={(4,): size, (5,): size, (6,): channels, (7,): xblock},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # a build, not a cache hit
    start = time.perf_counter()
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=672)  # MobileNetV3-large's first 5x5 stage at 14x14
    parser.add_argument("--size", type=int, default=14)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    build_seconds(unrolled, 256, args.size, args.channels)  # Triton's own first-build costs, not counted
    for name, (fn, xblock) in FORMS.items():
        times = [build_seconds(fn, xblock, args.size, args.channels) for _ in range(3)]
        print(f"{name}: sm_90 build {min(times):.2f} s (best of 3)")
    if not torch.cuda.is_available():
        return
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(args.channels, 1, 5, 5, device="cuda", dtype=torch.bfloat16)
    expected = F.conv2d(x, weight, padding=2, groups=args.channels)
    cudnn_ms = triton.testing.do_bench(lambda: F.conv2d(x, weight, padding=2, groups=args.channels))
    print(f"cuDNN: {cudnn_ms * 1000:.1f} us")
    numel = x.numel()
    for name, (fn, xblock) in FORMS.items():
        for block in (xblock // 2, xblock, xblock * 2):  # the build's block and its two neighbours
            out = torch.empty_like(expected)

            def launch(fn=fn, block=block, out=out):
                fn[(triton.cdiv(numel, block),)](x, weight, out, numel, args.size, args.size, args.channels, block)
            launch()
            error = (out.float() - expected.float()).abs().max().item()
            print(f"{name} XBLOCK={block}: {triton.testing.do_bench(launch) * 1000:.1f} us, "
                  f"max abs diff from cuDNN {error:.3g}")


if __name__ == "__main__":
    main()
