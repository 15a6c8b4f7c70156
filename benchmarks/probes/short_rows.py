"""Softmax over short rows as Swin's window attention has them (49 keys, a relative-position bias
gathered from a table, a shifted-window mask), smelt's persistent-reduction blocks against eager and
Inductor, then the whole Swin-T (bf16 inference, batch 32) with the best blocks, in one GPU call.

    python3 -m benchmarks.probes.short_rows [--no-model]

Swin's bf16 inference profile (RESULTS, twenty-fourth session): smelt's softmax kernels 209, 118 and
75 us where Inductor's take 72, 63 and 19; smelt's heuristic gives 49-long rows 64 rows a program
over 8 warps. Each variant overrides the blocks of every persistent reduction whose rows fit 64
(codegen/triton/kernel.py `choose_blocks`) and compiles with the graph cache off.
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.testing import do_bench

from benchmarks.probes.block_override import blocks_where, eager_and_inductor_us, us

# (XBLOCK, num_warps) of persistent reductions over rows of at most 64.
BLOCKS = [(2, 1), (4, 2), (8, 2), (8, 4), (16, 4), (32, 4), (32, 8)]


def window_softmax(scores, table, index, mask):
    windows, heads, n = mask.shape[0], table.shape[1], 49
    bias = table[index].view(n, n, heads).permute(2, 0, 1)
    s = scores.view(-1, heads, n, n) + bias
    s = s.view(-1, windows, heads, n, n) + mask.view(1, windows, 1, n, n)
    return s.view(-1, heads, n, n).softmax(-1)


def plain_softmax(x):
    return x.softmax(-1)


def blocks(override):
    """Persistent reductions over rows of at most 64 get (XBLOCK, num_warps) = override."""
    change = None if override is None else {"XBLOCK": override[0], "num_warps": override[1]}
    return blocks_where(lambda config: config.persistent and config.RBLOCK <= 64, change)


def sweep(label, fn, args) -> dict:
    want = fn(*args)
    times = eager_and_inductor_us(fn, args)
    for override in [None] + BLOCKS:
        torch._dynamo.reset()
        with blocks(override):
            compiled = torch.compile(fn, backend="smelt")
            got = compiled(*args)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        times[override or "heuristic"] = us(compiled, args)
    print(f"{label} us: " + ", ".join(f"{k if isinstance(k, str) else '%dx%d' % k} {v:.1f}" for k, v in times.items()),
          flush=True)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-model", action="store_true")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    totals = {}
    for heads, windows_per_image in ((3, 64), (6, 16), (12, 4)):
        scores = torch.randn(32 * windows_per_image * heads, 49, 49, **bf16)
        table = torch.randn(169, heads, **bf16)
        index = torch.randint(0, 169, (49 * 49,), device="cuda")
        mask = torch.randn(windows_per_image, 49, 49, **bf16)
        times = sweep(f"window softmax [{scores.shape[0]}, 49, 49]", window_softmax, (scores, table, index, mask))
        for k, v in times.items():
            totals[k] = totals.get(k, 0.0) + v
    times = sweep("plain softmax [301056, 49]", plain_softmax, (torch.randn(301056, 49, **bf16),))
    for k, v in times.items():
        totals[k] = totals.get(k, 0.0) + v
    smelt_only = {k: v for k, v in totals.items() if not isinstance(k, str) or k == "heuristic"}
    best = min(smelt_only, key=smelt_only.get)
    print(f"sum over the rows: " + ", ".join(f"{k if isinstance(k, str) else '%dx%d' % k} {v:.1f}"
                                            for k, v in totals.items()) + f"; best {best}", flush=True)
    if args.no_model or best == "heuristic":
        return
    from benchmarks.probes.gpu_model_profile import kernel_table, report
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    for label, override in (("heuristic", None), (f"{best[0]}x{best[1]}", best)):
        torch._dynamo.reset()
        with blocks(override):
            fn = case_callable(all_specs()["swin"], "infer_bf16", "real", "cuda", 0, "smelt")
            fn()
            fn()
        torch.cuda.synchronize()
        ms = do_bench(fn, return_mode="median")
        print(f"swin infer_bf16, persistent short rows {label}: {ms:.3f} ms")
        report(label, kernel_table(fn), 6)


if __name__ == "__main__":
    main()
