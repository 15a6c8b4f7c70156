"""Reductions whose rows are read in contiguous runs (Swin's patch merging: the four 2x2 neighbours
concatenated before a layer norm), judged column reductions as smelt judges them today or rows read in
runs, timed on the GPU: the merge and norm alone (eager, Inductor, smelt both ways), then Swin-T (bf16
inference, batch 32) both ways with its costliest kernels, in one GPU call.

    python3 -m benchmarks.probes.rows_in_runs [--no-model]

`KernelPlan.r_contiguous` takes a read's rindex coefficient: an index of Mods and floors has none, so
the merged rows loop over 64 x 64 blocks (148 and 103 us on the H200 where Inductor's take 60; RESULTS,
twenty-fourth session). The variant evaluates the first read's index at rindex 0..16 and takes unit
steps throughout as rows. Compiles run with the graph cache off, so each variant's code is its own.
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import triton
from triton.testing import do_bench

import smelt.config
from smelt.scheduler import kernel_plan
from smelt.scheduler.nodes import RINDEX, XINDEX
from smelt.scheduler.placement import Placement
from benchmarks.probes.block_override import eager_and_inductor_us, us

STEPS = 16


def rows_in_runs(plan) -> bool:
    """r_contiguous, or the first read with rindex walks 16 unit steps along r (at x 0 and 1)."""
    if _judged_by_coefficient(plan):
        return True
    for node in plan.nodes:
        if plan.placement[node.name] == Placement.X:
            continue
        for _, index in node.reads_in_kernel(plan.placement[node.name], plan.xnumel, plan.rnumel):
            if RINDEX not in index.free_symbols:
                continue
            if index.free_symbols - {XINDEX, RINDEX}:
                return False
            for x in (0, 1):
                values = [int(index.subs({XINDEX: x, RINDEX: r})) for r in range(STEPS + 1)]
                if any(b - a != 1 for a, b in zip(values, values[1:])):
                    return False
            return True
    return True


_judged_by_coefficient = kernel_plan.KernelPlan.r_contiguous


@contextlib.contextmanager
def judged(by_runs: bool):
    kernel_plan.KernelPlan.r_contiguous = rows_in_runs if by_runs else _judged_by_coefficient
    try:
        with smelt.config.override(graph_cache=False):
            yield
    finally:
        kernel_plan.KernelPlan.r_contiguous = _judged_by_coefficient


def merge_and_norm(x, weight, bias):
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
    return torch.nn.functional.layer_norm(x, (4 * c,), weight, bias)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-model", action="store_true")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    for side, channels in ((56, 96), (28, 192), (14, 384)):
        x = torch.randn(32, side, side, channels, **bf16)
        weight, bias = torch.randn(4 * channels, **bf16), torch.randn(4 * channels, **bf16)
        want = merge_and_norm(x, weight, bias)
        row = [f"{k} {v:.1f}" for k, v in eager_and_inductor_us(merge_and_norm, (x, weight, bias)).items()]
        for label, by_runs in (("columns (today)", False), ("rows in runs", True)):
            torch._dynamo.reset()
            with judged(by_runs):
                compiled = torch.compile(merge_and_norm, backend="smelt")
                got = compiled(x, weight, bias)
            torch.testing.assert_close(got, want, atol=6e-2, rtol=2e-2)
            row.append(f"{label} {us(compiled, (x, weight, bias)):.1f}")
        print(f"merge + norm [32, {side}, {side}, {channels}] us: " + ", ".join(row), flush=True)
    if args.no_model:
        return
    from benchmarks.probes.gpu_model_profile import kernel_table, report
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    for label, by_runs in (("columns (today)", False), ("rows in runs", True)):
        torch._dynamo.reset()
        with judged(by_runs):
            fn = case_callable(all_specs()["swin"], "infer_bf16", "real", "cuda", 0, "smelt")
            fn()
            fn()
        torch.cuda.synchronize()
        print(f"swin infer_bf16, {label}: {do_bench(fn, return_mode='median'):.3f} ms")
        report(label, kernel_table(fn), 8)


if __name__ == "__main__":
    main()
