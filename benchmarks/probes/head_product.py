"""A language model's head alone on the GPU (issue 22): smelt::padded_product (for half floats the
Triton kernel of runtime/unaligned_matmul.py) against the aligned column blocks it replaced, eager's
unpadded F.linear and cuBLAS on padded rows without a copy out; errors against a float64 product.

    python -m benchmarks.probes.head_product [--rows 4096] [--hidden 768]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

import smelt  # noqa: F401  (registers smelt::padded_product)
from smelt.runtime import padded_product

HEADS = (("gpt2", 50257, False), ("bert", 30522, True))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=768)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    print("| head | smelt us | column blocks us | eager unpadded us | cuBLAS padded, no copy us | max / rms error (smelt) | eager's |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, n, has_bias in HEADS:
        a = torch.randn(args.rows, args.hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.05
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None
        reference = F.linear(a.double(), w.double(), None if bias is None else bias.double())

        def error(x):
            d = x.double() - reference
            return f"{d.abs().max().item():.4f} / {d.pow(2).mean().sqrt().item():.5f}"
        out = torch.empty(args.rows, n, device="cuda", dtype=torch.bfloat16)
        padded_w = F.pad(w, [0, 0, 0, -n % 8])
        smelt_us = bench(lambda: torch.ops.smelt.padded_product(a, w.t(), bias, n))
        blocks_us = bench(lambda: padded_product._by_columns(a, w.t(), bias, n, out, 8))
        eager_us = bench(lambda: F.linear(a, w, bias))
        padded_us = bench(lambda: F.linear(a, padded_w))
        print(f"| {name} ({n}) | {smelt_us:.0f} | {blocks_us:.0f} | {eager_us:.0f} | {padded_us:.0f} | "
              f"{error(torch.ops.smelt.padded_product(a, w.t(), bias, n))} | {error(F.linear(a, w, bias))} |")


if __name__ == "__main__":
    main()
