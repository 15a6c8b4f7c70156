"""Where oneDNN's channels-last weight gradient on the CPU is wrong: small convolutions (dense and
depthwise, strides 1-3, paddings 0-3), each weight gradient taken from NCHW and channels-last
operands and compared with float64's, with the allocator's free memory filled with NaN first (the
wrong values include never-written ones, which fresh zeroed pages hide).

RESULTS 2026-12-03 (forty-third session), torch 2.13.0+cpu: in bfloat16 about 1% of strided shapes
give NaN, 1e38 or wrong sums from channels-last operands and none from NCHW; stride 1, float16 and
float32 none. `lowering/layout_plan.py` keeps such a backward's operands in NCHW.

    python -m benchmarks.probes.onednn_channels_last_weight_gradient [--shapes 1500] [--seed 0]
"""
from __future__ import annotations

import argparse
import collections
import random

import torch


def _poison(dtype: torch.dtype, *numels: int) -> None:
    """Allocate and free NaN-filled blocks, so the next allocations of these sizes start as NaN."""
    blocks = [torch.full((n,), float("nan"), dtype=dtype) for n in numels]
    del blocks


def sweep(dtype: torch.dtype, shapes: int, seed: int) -> tuple[collections.Counter, collections.Counter, dict]:
    rng = random.Random(seed)
    tried, wrong, example = collections.Counter(), collections.Counter(), {}
    while sum(tried.values()) < shapes:
        n, c = rng.choice([1, 2]), rng.choice([4, 8, 16])
        h, w, kh, kw = rng.randint(1, 7), rng.randint(1, 7), rng.randint(1, 5), rng.randint(1, 5)
        stride, pad, groups = rng.choice([1, 2, 3]), rng.choice([0, 1, 2, 3]), rng.choice([1, c])
        oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
        if oh < 1 or ow < 1:
            continue
        x, weight = torch.randn(n, c, h, w).to(dtype), torch.randn(c, c // groups, kh, kw).to(dtype)
        grad = torch.randn(n, c, oh, ow).to(dtype)
        args = ([0], [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups, [False, True, False])
        exact = torch.ops.aten.convolution_backward(grad.double(), x.double(), weight.double(), *args)[1]
        tolerance = 0.05 * (exact.abs().max().item() + 1)
        kind = (f"stride {'1' if stride == 1 else '>1'}", "depthwise" if groups == c else "dense")
        tried[kind] += 1
        for layout in (torch.contiguous_format, torch.channels_last):
            _poison(dtype, weight.numel(), x.numel(), 4096)
            got = torch.ops.aten.convolution_backward(grad.contiguous(memory_format=layout),
                                                      x.contiguous(memory_format=layout), weight, *args)[1]
            if not (got.double() - exact).abs().max().item() <= tolerance:  # NaN counts as wrong
                name = "channels-last" if layout == torch.channels_last else "NCHW"
                wrong[kind + (name,)] += 1
                example.setdefault(kind + (name,), dict(n=n, c=c, h=h, w=w, kernel=(kh, kw), stride=stride,
                                                        padding=pad, groups=groups))
    return tried, wrong, example


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; {args.shapes} shapes a dtype, seed {args.seed}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tried, wrong, example = sweep(dtype, args.shapes, args.seed)
        for kind in sorted(tried):
            counts = ", ".join(f"{layout} wrong {wrong[kind + (layout,)]}" for layout in ("NCHW", "channels-last"))
            print(f"{str(dtype):15s} {kind[0]:9s} {kind[1]:9s} tried {tried[kind]:5d}: {counts}")
        for key, shape in sorted(example.items()):
            print(f"  e.g. {dtype} {' '.join(key)}: {shape}")


if __name__ == "__main__":
    main()
