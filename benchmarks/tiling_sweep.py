"""Time smelt's tiled pointwise kernels against its 1-D kernels, eager, and the copy bandwidth,
for several tile shapes. For tuning smelt/codegen/triton/tiles.py on a GPU:

    python3 -m benchmarks.tiling_sweep [--configs default,1d,64x64w4,...] [--only t2d_fp32,...]
"""
from __future__ import annotations

import argparse
import sys

import torch

import smelt.artifact as artifact
import smelt.codegen.triton.tiles as tiles
import smelt.scheduler.kernel_plan as kernel_plan
import smelt.codegen.triton.kernel as triton_codegen
from benchmarks.backends import compile_fn
from benchmarks.measure import bench_ms, copy_bandwidth
from smelt.symbolic import static_int


def _cases(device):
    def randn(*shape, dtype):
        return lambda: (torch.randn(shape, device=device, dtype=dtype),)

    def two(a, b, dtype):
        return lambda: (torch.randn(a, device=device, dtype=dtype), torch.randn(b, device=device, dtype=dtype))

    f32, b16 = torch.float32, torch.bfloat16
    return {
        "t2d_fp32": (lambda x: x.t().contiguous(), randn(8192, 8192, dtype=f32)),
        "t2d_bf16": (lambda x: x.t().contiguous(), randn(8192, 8192, dtype=b16)),
        "t2d_add_fp32": (lambda x, y: x.t() + y, two((8192, 8192), (8192, 8192), f32)),
        "t2d_odd_fp32": (lambda x: x.t().contiguous(), randn(8191, 4097, dtype=f32)),
        "perm3d_fp32": (lambda x: x.permute(0, 2, 1).contiguous(), randn(64, 1024, 1024, dtype=f32)),
        "perm3d_bf16": (lambda x: x.permute(0, 2, 1).contiguous(), randn(64, 1024, 1024, dtype=b16)),
        "chlast_fp32": (lambda x: x.contiguous(memory_format=torch.channels_last), randn(64, 256, 56, 56, dtype=f32)),
        "chlast_bf16": (lambda x: x.contiguous(memory_format=torch.channels_last), randn(64, 256, 56, 56, dtype=b16)),
        "chain_bf16": (lambda x, y: torch.relu(x.t() * 2 + y).sigmoid(), two((8192, 8192), (8192, 8192), b16)),
    }


def _fixed_tiles(xblock, rblock, warps):
    def tile_blocks(t, itemsize, interpret):
        first = "x" if len(t.along_x) > len(t.along_r) else "r"
        layout = tiles.grid_layout(static_int(t.outer), static_int(t.inner), xblock, rblock, first)
        return artifact.TileBlocks(xblock, rblock, warps, *layout)
    return tile_blocks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="default,1d,32x32w4,64x64w4,64x64w8,128x64w8,64x128w8,128x128w8,32x128w4,128x32w4")
    parser.add_argument("--only", default=None)
    args = parser.parse_args()
    device = "cuda"
    peak = copy_bandwidth(device)
    print(f"copy bandwidth: {peak / 1e9:.0f} GB/s", flush=True)
    original_tiles, original_choice = triton_codegen.tile_blocks, kernel_plan.choose_tiling
    cases = _cases(device)
    names = args.only.split(",") if args.only else list(cases)
    print("| case | config | ms | GB/s | % of copy |")
    print("|---|---|---|---|---|")
    for name in names:
        fn, make = cases[name]
        inputs = make()
        expected = fn(*inputs)
        nbytes = sum(t.numel() * t.element_size() for t in inputs) + expected.numel() * expected.element_size()
        for config in args.configs.split(","):
            triton_codegen.tile_blocks, kernel_plan.choose_tiling = original_tiles, original_choice
            if config == "1d":
                kernel_plan.choose_tiling = lambda group, stored: None
            elif config != "default":
                xb, rest = config.split("x")
                rb, warps = rest.split("w")
                triton_codegen.tile_blocks = _fixed_tiles(int(xb), int(rb), int(warps))
            compiled = compile_fn("smelt", fn)
            try:
                actual = compiled(*inputs)
            except Exception as e:  # a tile shape Triton rejects: report and go on
                print(f"| {name} | {config} | failed: {type(e).__name__} | | |", flush=True)
                continue
            torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
            ms = bench_ms(lambda: compiled(*inputs), device)
            print(f"| {name} | {config} | {ms:.3f} | {nbytes / ms / 1e6:.0f} | {100 * nbytes / ms / 1e-3 / peak:.0f} |",
                  flush=True)
        ms = bench_ms(lambda: fn(*inputs), device)
        print(f"| {name} | eager | {ms:.3f} | {nbytes / ms / 1e6:.0f} | {100 * nbytes / ms / 1e-3 / peak:.0f} |",
              flush=True)
    triton_codegen.tile_blocks, kernel_plan.choose_tiling = original_tiles, original_choice
    return 0


if __name__ == "__main__":
    sys.exit(main())
