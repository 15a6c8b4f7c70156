"""Kernels that read a cat or a pad, smelt in one loop and in pieces (codegen/halide/pieces.py), against
eager and Inductor's C++ backend, in one process (issue 23): median us a call of each.

    python -m benchmarks.probes.cpu_pieces [--calls 200] [--only cat_1d,kv_cache]

Each case is compiled twice by smelt (pieces.SPLIT_KERNELS off, then on with every kernel that transposes in
tiles split too, whatever pieces.MIN_GATHERS_OVER_TILES says; the graph cache off), its
values checked against eager, and each compiled function timed before the next is compiled. The
first call of each (its compile, with a kernel cache folder of its own, empty) is timed too.
"""
from __future__ import annotations

import argparse
import os
import torch
import torch.nn.functional as F

from benchmarks.measure import median_call_ms


def _rope(b, s, h, d):
    def rope(x, cos, sin):
        q = x.view(b, s, h, d).transpose(1, 2)
        return q * cos + torch.cat((-q[..., d // 2:], q[..., :d // 2]), -1) * sin
    return rope, (torch.randn(b, s, h * d), torch.randn(s, d), torch.randn(s, d))


CASES = {
    "cat_1d": lambda: (lambda x: torch.cat([-x[32:], x[:32]]) * 2 + 1, (torch.randn(1 << 20),)),
    "kv_cache": lambda: (lambda p, n: torch.cat([p, n], dim=-2), (torch.randn(1, 8, 1023, 128), torch.randn(1, 8, 1, 128))),
    "kv_cache_small": lambda: (lambda p, n: torch.cat([p, n], dim=-2), (torch.randn(4, 2, 127, 64), torch.randn(4, 2, 1, 64))),
    "rope_1x512x32x128": lambda: _rope(1, 512, 32, 128),
    "rope_4x128x8x64": lambda: _rope(4, 128, 8, 64),
    "pad_last_dim": lambda: (lambda x: F.pad(x.exp(), (3, 5), value=-1.0) + 2, (torch.randn(64, 256, 250),)),
    # A dense block's cat of channels-last features back to NCHW: a store that transposes in tiles.
    "nchw_cat_of_8_channels_last": lambda: _nchw_cat(8, (2, 8, 48, 48)),
    "nchw_cat_of_4_channels_last": lambda: _nchw_cat(4, (4, 64, 56, 56)),
    "nchw_cat_of_2_channels_last": lambda: _nchw_cat(2, (8, 128, 14, 14)),
}


def _nchw_cat(count, shape):
    parts = tuple(torch.randn(shape).to(memory_format=torch.channels_last) for _ in range(count))
    return (lambda *parts: torch.cat([p.relu() for p in parts], 1).contiguous() * 2), parts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args(argv)
    os.environ["SMELT_GRAPH_CACHE"] = "0"
    import tempfile
    import time
    import smelt
    from smelt.config import override
    from smelt.codegen.halide import pieces
    names = [n for n in args.only.split(",") if n] or list(CASES)
    threshold = pieces.MIN_GATHERS_OVER_TILES
    print("| case | eager us | Inductor us | smelt, one loop us | smelt, in pieces us | smelt's first call s, one loop / in pieces |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for name in names:
        fn, inputs = CASES[name]()
        expected = fn(*inputs)
        times = [median_call_ms(fn, inputs, args.calls, warmup=10) * 1e3]
        # Each compiled function is timed before the next reset: after torch._dynamo.reset() a call
        # would compile it again, under whatever SPLIT_KERNELS says then.
        torch._dynamo.reset()
        times.append(median_call_ms(torch.compile(fn), inputs, args.calls, warmup=10) * 1e3)
        firsts = []
        try:
            for split in (False, True):
                pieces.SPLIT_KERNELS = split
                pieces.MIN_GATHERS_OVER_TILES = 1 if split else threshold
                torch._dynamo.reset()
                compiled = torch.compile(fn, backend="smelt")
                with tempfile.TemporaryDirectory() as cold, override(cache_dir=cold):
                    start = time.perf_counter()
                    torch.testing.assert_close(compiled(*inputs), expected)
                    firsts.append(time.perf_counter() - start)
                    times.append(median_call_ms(compiled, inputs, args.calls, warmup=10) * 1e3)
        finally:
            pieces.SPLIT_KERNELS, pieces.MIN_GATHERS_OVER_TILES = True, threshold
        print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {firsts[0]:.1f} / {firsts[1]:.1f} |")


if __name__ == "__main__":
    main()
