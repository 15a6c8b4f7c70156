"""Depthwise convolutions alone on the GPU (issue 22): smelt's kernel (lowering/depthwise_convolution.py)
against eager's cuDNN call and Inductor's, at the shapes of ConvNeXt-tiny, EfficientNet-B0 and
MobileNetV3-large (bf16, batch 32, channels-last), with the bytes-moved floor: reading the input and
writing the output once, at the measured copy bandwidth.

    python -m benchmarks.probes.depthwise_conv [--batch 32] [--fused] [--sweep-blocks]
    python -m benchmarks.probes.depthwise_conv --tiles 32x64x4 64x32x4 128x16x4 [--kernels 3 5]

--fused adds batch norm and hard-swish after each convolution (a mobile net's block): smelt fuses them.
--sweep-blocks times smelt's kernel with its block divided by 1-16 and 4 or 8 warps instead (how
`codegen/triton/kernel._block_shrink` was chosen). --tiles times it at each tile given as
XBLOCKxRBLOCKxWARPS (x runs along channels, r along positions), beside the heuristic's own.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

import smelt  # noqa: F401
import smelt.config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a dry run of the probe itself

# (model, channels, spatial size, kernel, stride)
SHAPES = (
    ("convnext s1", 96, 56, 7, 1), ("convnext s2", 192, 28, 7, 1), ("convnext s3", 384, 14, 7, 1),
    ("convnext s4", 768, 7, 7, 1),
    ("efficientnet", 96, 112, 3, 2), ("efficientnet", 144, 56, 5, 1), ("efficientnet", 240, 28, 3, 1),
    ("efficientnet", 672, 14, 5, 1),
    ("mobilenetv3", 64, 112, 3, 2), ("mobilenetv3", 120, 28, 5, 1), ("mobilenetv3", 480, 14, 3, 1),
    ("mobilenetv3", 960, 7, 5, 1),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--fused", action="store_true")
    parser.add_argument("--sweep-blocks", action="store_true")
    parser.add_argument("--tiles", nargs="+", default=None)
    parser.add_argument("--kernels", nargs="+", type=int, default=None, help="window sides to keep (all)")
    parser.add_argument("--shapes", nargs="+", default=None,
                        help="CHANNELS:SIZE:KERNEL:STRIDE shapes to time instead of the built-in ones")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.shapes:
        global SHAPES
        SHAPES = tuple(("given", *map(int, shape.split(":"))) for shape in args.shapes)
    if args.sweep_blocks:
        return sweep_blocks(args.batch)
    if args.tiles:
        return sweep_tiles(args.batch, [tuple(map(int, t.split("x"))) for t in args.tiles], args.kernels, args.fused)
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    big = torch.empty(2**28, device=DEVICE, dtype=torch.bfloat16)
    copy_gbs = 2 * big.numel() * 2 / bench(big.clone) / 1e3
    big = None
    print(f"copy bandwidth {copy_gbs:.0f} GB/s")
    print("| shape | eager (cuDNN) us | Inductor us | smelt us | smelt / Inductor | floor us | smelt's share of floor | max error smelt / eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, c, size, k, stride in SHAPES:
        x = torch.randn(args.batch, c, size, size, device=DEVICE, dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, 1, k, k, device=DEVICE, dtype=torch.bfloat16) * 0.1
        b = torch.randn(c, device=DEVICE, dtype=torch.bfloat16)
        scale = torch.rand(c, device=DEVICE, dtype=torch.bfloat16) + 0.5

        def fn(x, w, b, scale):
            y = F.conv2d(x, w, b, stride=stride, padding=k // 2, groups=c)
            return F.hardswish(y * scale[:, None, None]) if args.fused else y
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        with smelt.config.override(depthwise_kernels="on"):
            compiled = torch.compile(fn, backend="smelt")
            out = compiled(x, w, b, scale)
        exact = fn(x.double(), w.double(), b.double(), scale.double())
        eager_out = fn(x, w, b, scale)
        times = [bench(lambda f=f: f(x, w, b, scale)) for f in (fn, inductor, compiled)]
        floor = (x.numel() + out.numel()) * 2 / copy_gbs / 1e3
        errors = [(o.double() - exact).abs().max().item() for o in (out, eager_out)]
        print(f"| {name} {c}x{size}x{size} k{k} s{stride} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | "
              f"{times[1] / times[2]:.2f}x | {floor:.1f} | {floor / times[2]:.0%} | {errors[0]:.3g} / {errors[1]:.3g} |")


def sweep_blocks(batch: int) -> None:
    """smelt's kernel alone under each block division and warp count, overriding the heuristic."""
    import dataclasses
    import itertools
    import smelt.observe
    from smelt.codegen.triton import kernel
    chosen = kernel.tile_blocks  # looked up by kernel.choose_blocks at each call
    override = {}

    def forced(tiling, itemsize, interpret, shrink=1):
        tiles = chosen(tiling, itemsize, interpret)
        x, r, divide = tiles.xblock, tiles.rblock, override["divide"]
        while divide > 1:
            x, r = (x // 2, r) if x >= r and x > 1 else (x, max(1, r // 2))
            divide //= 2
        return dataclasses.replace(tiles, xblock=x, rblock=r, num_warps=override["warps"])
    kernel.tile_blocks = forced
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    print("| shape | cuDNN us | " + " | ".join(f"/{d}, {w} warps" for d, w in itertools.product((1, 2, 4, 8, 16), (4, 8)))
          + " |")
    for name, c, size, k, stride in SHAPES:
        x = torch.randn(batch, c, size, size, device=DEVICE, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, 1, k, k, device=DEVICE, dtype=torch.bfloat16) * 0.1
        fn = lambda x, w: F.conv2d(x, w, None, stride=stride, padding=k // 2, groups=c)  # noqa: E731
        row = []
        for divide, warps in itertools.product((1, 2, 4, 8, 16), (4, 8)):
            override.update(divide=divide, warps=warps)
            torch._dynamo.reset()
            with smelt.config.override(depthwise_kernels="on", graph_cache=False):
                compiled = torch.compile(fn, backend="smelt")
                compiled(x, w)
            row.append(bench(lambda: compiled(x, w)))
        print(f"| {name} {c}x{size}x{size} k{k} s{stride} | {bench(lambda: fn(x, w)):.1f} | "
              + " | ".join(f"{t:.1f}" for t in row) + " |")
    kernel.tile_blocks = chosen


def sweep_tiles(batch: int, tiles: list[tuple[int, int, int]], kernels: list[int] | None, fused: bool) -> None:
    """smelt's kernel alone (with `fused`, a norm's scale and shift and a SiLU after it) at each
    (XBLOCK, RBLOCK, warps) tile and at the heuristic's, with eager's time."""
    import dataclasses
    from smelt.codegen.triton import kernel
    chosen = kernel.tile_blocks
    override: dict = {}
    picked: list = []

    def forced(tiling, itemsize, interpret, *rest):
        tiles_now = chosen(tiling, itemsize, interpret, *rest)
        picked.append((tiles_now.xblock, tiles_now.rblock, tiles_now.num_warps))
        if not override:
            return tiles_now
        return dataclasses.replace(tiles_now, xblock=override["x"], rblock=override["r"], num_warps=override["w"])
    kernel.tile_blocks = forced
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    print("| shape | eager us | heuristic (tile) us | " + " | ".join(f"{x}x{r}, {w} warps" for x, r, w in tiles) + " |")
    print("| --- " * (3 + len(tiles)) + "|")
    try:
        for name, c, size, k, stride in SHAPES:
            if kernels and k not in kernels:
                continue
            x = torch.randn(batch, c, size, size, device=DEVICE, dtype=torch.bfloat16)
            x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(c, 1, k, k, device=DEVICE, dtype=torch.bfloat16) * 0.1
            scale, shift = (torch.rand(c, 1, 1, device=DEVICE, dtype=torch.bfloat16) + 0.5 for _ in range(2))

            def fn(x, w, stride=stride, k=k, c=c):
                y = F.conv2d(x, w, None, stride=stride, padding=k // 2, groups=c)
                return F.silu(y * scale + shift) if fused else y
            expected = fn(x, w).float()
            row = []
            for config in [None, *tiles]:
                override.clear()
                if config is not None:
                    override.update(x=config[0], r=config[1], w=config[2])
                picked.clear()
                torch._dynamo.reset()
                with smelt.config.override(depthwise_kernels="on", graph_cache=False):
                    compiled = torch.compile(fn, backend="smelt")
                    error = (compiled(x, w).float() - expected).abs().max().item()
                assert error < 0.1, (name, config, error)
                row.append(f"{bench(lambda: compiled(x, w)):.1f}" + (f" ({'x'.join(map(str, picked[0]))})"
                                                                    if config is None and picked else ""))
            print(f"| {name} {c}x{size}x{size} k{k} s{stride} | {bench(lambda: fn(x, w)):.1f} | " + " | ".join(row) + " |",
                  flush=True)
    finally:
        kernel.tile_blocks = chosen


if __name__ == "__main__":
    main()
