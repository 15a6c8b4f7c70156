"""The element types smelt's kernels compute, in every backend (Triton and Halide print each).

Any other dtype (float8 and float4 variants, complex, quantized, sub-byte ints, bits types) is
never read or written by a kernel: an op touching one runs as an ATen call, decided at lowering.
"""
from __future__ import annotations

import torch

KERNEL_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
})


def is_kernel_dtype(dtype: torch.dtype) -> bool:
    return dtype in KERNEL_DTYPES
