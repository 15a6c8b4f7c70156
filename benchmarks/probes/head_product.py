"""A language model's head alone on the GPU (issue 22): smelt::padded_product (the logits as the first
N columns of padded rows) against eager's unpadded F.linear, Inductor's way (the weight padded on
every call, one product) and cuBLAS over a weight already padded (the floor); errors against a
float64 product.

    python -m benchmarks.probes.head_product [--rows 4096] [--hidden 768] [--dtype float32]

Two more ways read the weight in place, its last few columns padded apart (the peak eager's): the
bias by cuBLAS into the padded rows' strided columns, and the product alone there, the bias added
by a pass over the rows.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

import smelt  # noqa: F401  (registers smelt::padded_product)

HEADS = (("gpt2", 50257, False), ("bert", 30522, True))


def head_arguments(doc: str, argv):
    """The head probes' command line (--rows, --hidden), a fixed seed, and their timer (us, median)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    torch.manual_seed(0)
    return parser.parse_args(argv), lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3


def main(argv=None) -> None:
    args, bench = head_arguments(__doc__, argv)
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {args.rows} rows of {args.hidden}")
    print("| head | smelt us | eager unpadded us | weight padded each call us | weight already padded us | "
          "in place, strided addmm us | in place, bias pass us | max / rms error (smelt) | eager's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, n, has_bias in HEADS:
        a = torch.randn(args.rows, args.hidden, device="cuda", dtype=dtype)
        w = torch.randn(n, args.hidden, device="cuda", dtype=dtype) * 0.05
        bias = torch.randn(n, device="cuda", dtype=dtype) if has_bias else None
        reference = F.linear(a.double(), w.double(), None if bias is None else bias.double())
        pad = -n % (16 // a.element_size())
        aligned = n - n % (16 // a.element_size())

        def in_place(bias_pass: bool):
            rows = torch.empty(args.rows, n + pad, device="cuda", dtype=dtype)
            b = w.t()
            tail = F.pad(w[aligned:], [0, 0, 0, pad]).t()
            if bias is None or bias_pass:
                torch.mm(a, b[:, :aligned], out=rows[:, :aligned])
                torch.mm(a, tail, out=rows[:, aligned:])
                if bias is not None:
                    rows[:, :n] += bias
            else:
                torch.addmm(bias[:aligned], a, b[:, :aligned], out=rows[:, :aligned])
                torch.addmm(F.pad(bias[aligned:], [0, pad]), a, tail, out=rows[:, aligned:])
            return rows[:, :n]

        def error(x):
            d = x.double() - reference
            return f"{d.abs().max().item():.4f} / {d.pow(2).mean().sqrt().item():.5f}"

        def pad_each_call():
            return F.linear(a, F.pad(w, [0, 0, 0, pad]), None if bias is None else F.pad(bias, [0, pad]))
        padded_w, padded_bias = F.pad(w, [0, 0, 0, pad]), None if bias is None else F.pad(bias, [0, pad])
        smelt_us = bench(lambda: torch.ops.smelt.padded_product(a, w.t(), bias, n))
        eager_us = bench(lambda: F.linear(a, w, bias))
        each_us = bench(pad_each_call)
        floor_us = bench(lambda: F.linear(a, padded_w, padded_bias))
        strided_us = bench(lambda: in_place(False))
        pass_us = bench(lambda: in_place(True))
        for way in (in_place(False), in_place(True)):
            assert (way.double() - reference).abs().max() < 1e-2 * reference.abs().max(), name
        print(f"| {name} ({n}) | {smelt_us:.0f} | {eager_us:.0f} | {each_us:.0f} | {floor_us:.0f} | {strided_us:.0f} | "
              f"{pass_us:.0f} | {error(torch.ops.smelt.padded_product(a, w.t(), bias, n))} | {error(F.linear(a, w, bias))} |")


if __name__ == "__main__":
    main()
