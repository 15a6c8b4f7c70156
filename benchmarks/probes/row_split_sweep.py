"""smelt's own row-split kernel for the long-row softmax, compiled at several chunk sizes and warp
counts and timed in one GPU call (the chunk shape is a codegen constant, patched here).

    python3 -m benchmarks.probes.row_split_sweep [--rows 256 --cols 262144]

Each variant is checked against eager before it is timed (do_bench median, L2 flushed); the table
gives ms and % of the measured copy bandwidth for one read and one write of the tensor.
"""
from __future__ import annotations

import argparse
import os

import torch
from triton.testing import do_bench

os.environ["SMELT_GRAPH_CACHE"] = "0"  # each variant must be compiled, not read back

import smelt  # noqa: E402,F401
from smelt.codegen.triton import kernel as triton_codegen
from smelt.codegen.triton import eviction
from smelt.codegen.triton import row_split as triton_row_split
from benchmarks.backends import compile_fn
from benchmarks.measure import copy_bandwidth


def softmax(x):
    return torch.softmax(x, dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=262144)
    args = parser.parse_args()
    bw = copy_bandwidth("cuda")
    x = torch.randn(args.rows, args.cols, device="cuda")
    expected = softmax(x)
    bytes_moved = 2 * x.numel() * 4
    rows = []
    plain_policy = eviction.EvictionPolicy.for_load

    def streaming_policy(self, buffer, index, rank, phase):
        # The chunk is read once into registers and never again: evict_first.
        return "evict_first" if rank == 2 else None

    for chunk, warps, hints in [(4096, 4, False), (8192, 4, False), (8192, 8, False), (16384, 8, False),
                                (16384, 16, False), (8192, 4, True)]:
        triton_row_split.CHUNK = triton_codegen.CHUNK = chunk
        triton_row_split.WARPS = triton_codegen.WARPS = warps
        eviction.EvictionPolicy.for_load = streaming_policy if hints else plain_policy
        f = compile_fn("smelt", softmax)
        try:
            torch.testing.assert_close(f(x), expected, rtol=1e-4, atol=1e-5)
            ms = do_bench(lambda: f(x), return_mode="median")
            rows.append((chunk, warps, hints, f"{ms:.4f}", f"{bytes_moved / (ms * 1e-3) / bw:.0%}"))
        except Exception as e:  # noqa: BLE001 - a shape that does not compile or fit
            rows.append((chunk, warps, hints, f"{type(e).__name__}: {str(e).splitlines()[0][:60]}", "-"))
    print(f"\n### row split sweep, softmax over {args.rows} x {args.cols} fp32 (copy BW {bw / 1e9:.0f} GB/s)\n")
    print("| chunk | warps | evict_first loads | ms | % of copy BW |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
