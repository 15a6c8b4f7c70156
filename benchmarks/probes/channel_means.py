"""The squeeze of a squeeze-and-excite block as EfficientNet-B0 computes it on the GPU: batch norm and
SiLU of a channels-last activation, then its mean over each image's positions (a reduction over a
strided dimension, split in two kernels), smelt's block configurations for the looped first kernel
against eager and Inductor, in one GPU call.

    python3 -m benchmarks.probes.channel_means [--batch 32]

EfficientNet-B0's bf16 inference profile (RESULTS, twenty-fourth session) put three of these at 54,
38 and 34 us on the H200 where Inductor's of the kind take 8 us. Each variant overrides the heuristic's blocks
for every looped reduction of the graph (codegen/triton/kernel.py `choose_blocks`) and compiles with
the graph cache off, so each variant's code is its own. `split off` turns split reductions off.
"""
from __future__ import annotations

import argparse

import torch
import triton

import smelt.config
from benchmarks.probes.block_override import blocks_where, eager_and_inductor_us, us

# (channels, side) of EfficientNet-B0's expanded activations whose squeeze is costly at batch 32.
SHAPES = [(96, 112), (144, 56), (240, 28), (672, 14)]
# (XBLOCK, RBLOCK, num_warps) of the looped first kernel.
BLOCKS = [(32, 64, 4), (64, 32, 4), (128, 32, 8), (128, 16, 4), (256, 16, 8), (32, 128, 8), (16, 256, 8)]


def squeeze(x, scale, shift):
    return torch.nn.functional.silu(x * scale + shift).mean((2, 3), keepdim=True)


def blocks(override):
    """Looped reductions get (XBLOCK, RBLOCK, num_warps) = override."""
    change = None if override is None else dict(zip(("XBLOCK", "RBLOCK", "num_warps"), override))
    return blocks_where(lambda config: not config.persistent, change)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for channels, side in SHAPES:
        x = torch.randn(args.batch, channels, side, side, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        scale, shift = (torch.randn(1, channels, 1, 1, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        want = squeeze(x, scale, shift)
        floor = x.numel() * x.element_size() / 3.0e12 * 1e6  # us at 3 TB/s
        row = [f"{k} {v:.1f}" for k, v in eager_and_inductor_us(squeeze, (x, scale, shift)).items()]
        runs = [("heuristic", None, {})] + [(f"{b[0]}x{b[1]}/{b[2]}", b, {}) for b in BLOCKS]
        runs.append(("split off", None, {"split_reductions": False}))
        for label, override, setting in runs:
            torch._dynamo.reset()
            with blocks(override), smelt.config.override(**setting):
                compiled = torch.compile(squeeze, backend="smelt")
                got = compiled(x, scale, shift)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
            row.append(f"{label} {us(compiled, (x, scale, shift)):.1f}")
        print(f"[{args.batch}, {channels}, {side}, {side}] (read floor {floor:.1f}) us: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
