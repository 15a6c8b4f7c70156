"""Reductions whose rows are read in contiguous runs (Swin's patch merging: the four 2x2 neighbours
concatenated before a layer norm), judged column reductions (by the rindex coefficient alone, as
smelt did until the twenty-fifth session) or rows read in runs (`KernelPlan.r_contiguous` today),
timed: the merge and norm alone (eager, Inductor, smelt both ways), then on CUDA Swin-T (bf16
inference, batch 32) both ways with its costliest kernels, in one call.

    python3 -m benchmarks.probes.rows_in_runs [--no-model] [--device cpu]

An index of Mods and floors has no rindex coefficient, so by the coefficient alone the merged rows
looped over 64 x 64 blocks on the GPU (148 and 103 us in Swin on the H200 where Inductor's take 60;
RESULTS, twenty-fourth session). On the CPU the judgement steers Halide's schedule (vectorized along
r or along x). Compiles run with the graph cache off, so each variant's code is its own.
"""
from __future__ import annotations

import argparse
import contextlib

import torch
from triton.testing import do_bench

import smelt.config
from smelt.scheduler import kernel_plan
from benchmarks.probes.block_override import eager_and_inductor_us, us


@contextlib.contextmanager
def judged(by_runs: bool):
    """by_runs False: the judgement before rows in runs, the rindex coefficient alone (an index with
    none, of Mods and floors, is a column)."""
    real = kernel_plan._steps_in_unit_runs
    if not by_runs:
        kernel_plan._steps_in_unit_runs = lambda index, rnumel: False
    try:
        with smelt.config.override(graph_cache=False):
            yield
    finally:
        kernel_plan._steps_in_unit_runs = real


def merge_and_norm(x, weight, bias):
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
    return torch.nn.functional.layer_norm(x, (4 * c,), weight, bias)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-model", action="store_true")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    print(f"torch {torch.__version__}, " + (torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"))
    # The CPU row is float32 at batch 4: bfloat16 there is emulated, and Swin's CPU sizes are small.
    bf16 = dict(device="cuda", dtype=torch.bfloat16) if cuda else dict(device="cpu", dtype=torch.float32)
    batch = 32 if cuda else 4
    for side, channels in ((56, 96), (28, 192), (14, 384)):
        x = torch.randn(batch, side, side, channels, **bf16)
        weight, bias = torch.randn(4 * channels, **bf16), torch.randn(4 * channels, **bf16)
        want = merge_and_norm(x, weight, bias)
        row = [f"{k} {v:.1f}" for k, v in eager_and_inductor_us(merge_and_norm, (x, weight, bias)).items()]
        for label, by_runs in (("by coefficient", False), ("rows in runs", True)):
            torch._dynamo.reset()
            with judged(by_runs):
                compiled = torch.compile(merge_and_norm, backend="smelt")
                got = compiled(x, weight, bias)
            torch.testing.assert_close(got, want, atol=6e-2, rtol=2e-2)
            row.append(f"{label} {us(compiled, (x, weight, bias)):.1f}")
        print(f"merge + norm [{batch}, {side}, {side}, {channels}] us: " + ", ".join(row), flush=True)
    if args.no_model or not cuda:
        return
    from benchmarks.probes.gpu_model_profile import kernel_table, report
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    for label, by_runs in (("by coefficient", False), ("rows in runs", True)):
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
