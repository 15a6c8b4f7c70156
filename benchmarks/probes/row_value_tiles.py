"""Pointwise kernels over channels-last activations whose per-channel values (a batch norm's scale
and shift) are computed once per tile column (`SMELT_ROW_VALUE_TILES`, scheduler/tiling.py) rather
than per element, timed on the GPU at a few tile sizes against the flat walk, eager and Inductor.

    python3 -m benchmarks.probes.row_value_tiles [--models efficientnet,mobilenetv3,resnet50]

The first A/B on whole models (RESULTS, twenty-fifth session): with the tiles ResNet-50's GPU time
1.651 -> 1.523 ms (its stem's BN + ReLU 74 -> 48 us), but EfficientNet's 1.730 -> 1.976 (its stem's
BN + SiLU 83 -> 123 us) and MobileNetV3's 0.994 -> 1.284: the tile (8192 bf16 elements over 8
warps, 32 a thread, codegen/triton/tiles.py) was sized for transposes, not for kernels whose
per-element work is an exp and a division. Each variant here fixes the tile's element count and
warps for every row-value tile; compiles run with the graph cache off.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import smelt.config
from smelt.codegen.triton import kernel as triton_kernel
from smelt.symbolic import next_power_of_2, static_int
from benchmarks.probes.block_override import eager_and_inductor_us, us

# (elements a tile, warps); None: the heuristic's.
TILES = [None, (1024, 4), (2048, 4), (2048, 8), (4096, 8)]


@contextlib.contextmanager
def tiles(shape):
    real = triton_kernel.tile_blocks

    def sized(tiling, itemsize, interpret, shrink=1):
        blocks = real(tiling, itemsize, interpret, shrink)
        if shape is None or interpret:
            return blocks
        budget, warps = shape
        rn = static_int(tiling.inner)
        rblock = min(blocks.rblock, budget)
        xblock = max(1, budget // rblock)
        xn = static_int(tiling.outer)
        if xn is not None:
            xblock = min(xblock, next_power_of_2(xn))
        return dataclasses.replace(blocks, xblock=xblock, rblock=rblock if rn is None else min(rblock, next_power_of_2(rn)),
                                   num_warps=warps)
    triton_kernel.tile_blocks = sized
    try:
        yield
    finally:
        triton_kernel.tile_blocks = real


def bn_act(act):
    def fn(x, mean, var, weight, bias):
        return act(F.batch_norm(x, mean, var, weight, bias, False, 0.0, 1e-5))
    return fn


def bn_silu_gate(x, mean, var, weight, bias, gate):
    return F.silu(F.batch_norm(x, mean, var, weight, bias, False, 0.0, 1e-5)) * torch.sigmoid(gate)


CASES = [  # name, fn, [N, C, H, W]
    ("BN + SiLU (EfficientNet stem)", bn_act(F.silu), (32, 32, 112, 112)),
    ("BN + SiLU, 96 channels", bn_act(F.silu), (32, 96, 112, 112)),
    ("BN + ReLU (ResNet-50 stem)", bn_act(F.relu), (32, 64, 112, 112)),
    ("BN + hardswish (MobileNetV3 stem)", bn_act(F.hardswish), (32, 16, 112, 112)),
    ("BN + SiLU times a gate (squeeze-excite)", bn_silu_gate, (32, 32, 112, 112)),
]


def case_args(fn, size):
    n, c, h, w = size
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(n, c, h, w, **bf16).to(memory_format=torch.channels_last)
    args = [x, torch.randn(c, **bf16), torch.rand(c, **bf16) + 0.5, torch.randn(c, **bf16), torch.randn(c, **bf16)]
    if fn is bn_silu_gate:
        args.append(torch.randn(n, c, 1, 1, **bf16))
    return tuple(args)


def label(shape) -> str:
    return "heuristic" if shape is None else f"{shape[0]}/{shape[1]}w"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="efficientnet,mobilenetv3,resnet50")
    parser.add_argument("--model-tiles", default="2048/4,1024/4")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, fn, size in CASES:
        inputs = case_args(fn, size)
        want = fn(*inputs)
        row = [f"{k} {v:.1f}" for k, v in eager_and_inductor_us(fn, inputs).items()]
        for setting, shapes in (("off", [None]), ("on", TILES)):
            for shape in shapes:
                torch._dynamo.reset()
                with smelt.config.override(row_value_tiles=setting, graph_cache=False), tiles(shape):
                    compiled = torch.compile(fn, backend="smelt")
                    got = compiled(*inputs)
                torch.testing.assert_close(got, want, atol=6e-2, rtol=2e-2)
                row.append(f"{'flat' if setting == 'off' else label(shape)} {us(compiled, inputs):.1f}")
        print(f"{name} {list(size)} us: " + ", ".join(row), flush=True)
    if not args.models:
        return
    from benchmarks.probes.gpu_model_profile import kernel_table, report
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    variants = [("off", None)] + [("on", tuple(int(v.rstrip("w")) for v in t.split("/")))
                                  for t in args.model_tiles.split(",") if t]
    for model in args.models.split(","):
        for setting, shape in variants:
            torch._dynamo.reset()
            with smelt.config.override(row_value_tiles=setting, graph_cache=False), tiles(shape):
                fn = case_callable(all_specs()[model], "infer_bf16", "real", "cuda", 0, "smelt")
                fn()
                fn()
            torch.cuda.synchronize()
            name = f"{model} tiles {setting}" + (f" {label(shape)}" if setting == "on" else "")
            print(f"{name}: wall {do_bench(fn, return_mode='median'):.3f} ms")
            report(name, kernel_table(fn), 4)


if __name__ == "__main__":
    main()
