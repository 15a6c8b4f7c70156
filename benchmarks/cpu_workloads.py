"""The CPU rows (`benchmarks.run --device cpu`): the GPU suite's kernels at sizes a 2-core CPU
runs in about a millisecond (1-4M elements), plus a small MLP whose matrix products stay in ATen.

They reuse the GPU rows' functions; only shapes and dtypes differ.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.workloads import (Workload, _with_affine, column_sum, cumsum, layer_norm, randn, silu_mul, softmax,
                                  transpose_add, var_mean)


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def mlp(x, w1, b1, w2, b2):
    # The two products run in ATen for every backend: the row measures what lies between them.
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _mlp_inputs(shape, dtype, device):
    tokens, dim = shape
    hidden = 4 * dim
    x = torch.randn(tokens, dim, dtype=dtype, device=device)
    w1 = torch.randn(hidden, dim, dtype=dtype, device=device) / dim ** 0.5
    w2 = torch.randn(dim, hidden, dtype=dtype, device=device) / hidden ** 0.5
    b1, b2 = (torch.randn(n, dtype=dtype, device=device) for n in (hidden, dim))
    return x, w1, b1, w2, b2


def _mlp_bytes(inputs) -> None:
    return None  # matrix products dominate: no bytes-moved floor to compare against


FP32 = torch.float32
CPU_WORKLOADS: list[Workload] = [
    Workload("silu_mul", silu_mul, (2048, 2048), (64, 256), FP32, build=randn(2)),
    Workload("silu_mul_bf16", silu_mul, (2048, 2048), (64, 256), torch.bfloat16, build=randn(2)),
    Workload("layer_norm", layer_norm, (2048, 2048), (64, 256), FP32, build=_with_affine(bias=True)),
    Workload("softmax", softmax, (2048, 2048), (64, 128), FP32),
    Workload("rms_norm", rms_norm, (2048, 2048), (64, 256), FP32, build=_with_affine(bias=False)),
    Workload("transpose_add", transpose_add, (2048, 2048), (96, 96), FP32, build=randn(2)),
    # Sums of 4096 elements: a different summation order moves near-zero results by ~1e-4.
    Workload("column_sum", column_sum, (4096, 1024), (256, 64), FP32, tolerance=dict(rtol=1e-4, atol=1e-3)),
    Workload("var_mean", var_mean, (2048, 2048), (64, 128), FP32),
    Workload("cumsum", cumsum, (2048, 2048), (64, 128), FP32, tolerance=dict(rtol=1e-4, atol=1e-3)),
    Workload("mlp", mlp, (512, 512), (16, 64), FP32, build=_mlp_inputs, bytes_moved=_mlp_bytes,
             desc="512x512 -> 2048 -> 512 fp32", tolerance=dict(rtol=1e-3, atol=1e-3)),
]
