"""Tiled pointwise kernels with the grid walking x tiles first, r tiles first, or as smelt picks
(codegen/triton/tiles.py grid_layout), timed in one GPU call: which order keeps DRAM pages open.

    python3 -m benchmarks.probes.tile_order_sweep
"""
import os
import torch
from triton.testing import do_bench
import smelt.artifact as artifact
import smelt.codegen.triton.tiles as tiling
from benchmarks.backends import compile_fn
from benchmarks.measure import copy_bandwidth
os.environ["SMELT_GRAPH_CACHE"] = "0"
bw = copy_bandwidth("cuda")
orig = tiling.grid_layout
cases = {
    "x.t()+y fp32 8192^2": (lambda x, y: x.t() + y, lambda: (torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda"))),
    "x.t().contiguous() fp32": (lambda x: x.t().contiguous(), lambda: (torch.randn(8192, 8192, device="cuda"),)),
    "x.t()+y bf16": (lambda x, y: x.t() + y, lambda: (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16), torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16))),
    "x + y.t() fp32": (lambda x, y: x + y.t(), lambda: (torch.randn(8192, 8192, device="cuda"), torch.randn(8192, 8192, device="cuda"))),
    "permute3d": (lambda x: x.permute(0, 2, 1).contiguous(), lambda: (torch.randn(64, 1024, 1024, device="cuda"),)),
}
for name, (fn, make) in cases.items():
    inputs = make()
    exp = fn(*inputs)
    nbytes = sum(t.numel() * t.element_size() for t in inputs) + exp.numel() * exp.element_size()
    for mode in ("default", "x first", "r first"):
        def layout(xn, rn, xb, rb, first, mode=mode):
            axes, fold = orig(xn, rn, xb, rb, first)
            if mode == "x first": axes = ("x", "r")
            if mode == "r first": axes = ("r", "x")
            second = -(-xn // xb) if axes[1] == "x" else -(-rn // rb)
            return axes, second > artifact.GRID_AXIS_LIMIT
        tiling.grid_layout = layout
        torch._dynamo.reset()
        f = compile_fn("smelt", fn)
        torch.testing.assert_close(f(*inputs), exp)
        ms = do_bench(lambda: f(*inputs), return_mode="median")
        print(f"| {name} | {mode} | {ms:.4f} | {nbytes / (ms * 1e-3) / bw:.0%} |", flush=True)
    tiling.grid_layout = orig
