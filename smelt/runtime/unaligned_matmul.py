"""A half-float matrix product written straight into rows that cuBLAS cannot write fast.

GPT-2's head writes [4096, 50,257] bf16 logits: rows of 100,514 bytes, not a multiple of 16, and
cuBLAS then picks kernels that move one element at a time (3.3 ms on the H100 against 0.45 padded).
smelt::padded_product (padded_product.py) used to run cuBLAS over aligned blocks of columns into a
16 MB scratch and copy each block out: 25 products and 27 copies, 0.94 ms of GPU time and about
1 ms of host time a call. This Triton kernel reads the operands with any strides and stores each
tile into the unaligned rows itself: one launch, no scratch, no copy.

Each program computes a BLOCK_M x BLOCK_N tile in float32 and rounds it once to the output's dtype,
after adding the bias in float32, as cuBLAS's bias epilogue does. Programs walk the tiles in groups
of GROUP_M rows of tiles so that the tiles resident at once share their A and B blocks in L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Hopper-sized tiles (the shape Triton's matmul tutorial finds fastest for half floats on the H100):
# 3 stages of 128x64 and 64x256 half tiles are 144 KiB of shared memory.
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
HALF_FLOATS = (torch.float16, torch.bfloat16)


@triton.jit
def unaligned_product(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # C[M, N] = A[M, K] @ B[K, N] (+ bias[N]), C's rows `stride_cm` apart, its columns contiguous.
    pid = tl.program_id(0)
    # Plain arithmetic, not tl.cdiv: the CPU tests run this kernel in Triton's interpreter, where
    # Triton's own @jit helpers cannot be called.
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge read row 0 / column 0 again (in bounds, no masks in the loop);
    # their results are never stored.
    a_rows = tl.where(rm < M, rm, 0)
    b_cols = tl.where(rn < N, rn, 0)
    a_tile = a_ptr + a_rows[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_tile = b_ptr + rk[:, None] * stride_bk + b_cols[None, :].to(tl.int64) * stride_bn
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        if EVEN_K:
            a = tl.load(a_tile)
            b = tl.load(b_tile)
        else:
            left = K - k * BLOCK_K
            a = tl.load(a_tile, mask=rk[None, :] < left, other=0.0)
            b = tl.load(b_tile, mask=rk[:, None] < left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + b_cols).to(tl.float32)[None, :]
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def applies(a: torch.Tensor, b: torch.Tensor, bias) -> bool:
    """Half floats on a CUDA device, 2-D operands of one dtype, a bias of one row (or none)."""
    return (a.is_cuda and a.dtype in HALF_FLOATS and b.dtype == a.dtype and a.dim() == b.dim() == 2
            and (bias is None or (bias.dtype == a.dtype and bias.dim() == 1)))


def product_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out[:, :N] = a @ b[:, :N] (+ bias[:N]), N = out's columns (b and bias may be wider: padded)."""
    m, n = out.shape
    k = a.shape[1]
    config = dict(CONFIG)
    warps, stages = config.pop("num_warps"), config.pop("num_stages")
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
    unaligned_product[grid](a, b, bias if bias is not None else out, out, m, n, k, a.stride(0), a.stride(1),
                            b.stride(0), b.stride(1), out.stride(0), HAS_BIAS=bias is not None,
                            EVEN_K=k % config["BLOCK_K"] == 0, num_warps=warps, num_stages=stages, **config)
    return out
