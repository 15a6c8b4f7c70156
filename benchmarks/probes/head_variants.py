"""BERT's biased LM head (4096 x 768 @ 768 x 30,522, bf16, into eager's unpadded rows) as variants of
runtime/biased_head.py's TMA kernel, against cuBLAS (issue 22): the head is the one kernel of BERT's
inference where smelt's GPU time is above Inductor's (370 us against its 284 + 24 us padding the
weight, twenty-third session). Variants: the epilogue stored in two halves (fewer registers live
while storing), tile orders that walk all row tiles of one weight tile (the weight read once from
HBM), warp specialization where Triton supports it, one tile per program (no persistence), and
several tile shapes and pipeline depths; and into padded rows (16-byte aligned, as Inductor's
logits come back) through TMA stores.

    python -m benchmarks.probes.head_variants [--rows 4096] [--hidden 768] [--vocab 30522]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from smelt.runtime import biased_head


@triton.jit
def head_variant_tma_store(a_desc, w_desc, bias_ptr, c_desc, M, N, K, NUM_PROGRAMS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, HALVES: tl.constexpr):
    # The same product stored through a TMA descriptor: the result's rows must be 16-byte aligned (padded).
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    k_steps = (K + BLOCK_K - 1) // BLOCK_K
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_m) * BLOCK_M
        off_n = ((tile % per_group) // group_m) * BLOCK_N
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k in range(k_steps):
            acc = tl.dot(a_desc.load([off_m, k * BLOCK_K]), w_desc.load([off_n, k * BLOCK_K]).T, acc)
        if HALVES:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            rn = off_n + tl.arange(0, BLOCK_N // 2)
            left += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            rn += BLOCK_N // 2
            right += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            rn = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def run_tma_store(out, a, w, bias, block_m, block_n, block_k, group_m, warps, stages, halves):
    m, n = out.shape
    k = a.shape[1]
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    programs = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, block_k])
    w_desc = TensorDescriptor(w, [n, k], [w.stride(0), 1], [block_n, block_k])
    c_desc = TensorDescriptor(out, [m, n], [out.stride(0), 1], [block_m, block_n // 2 if halves else block_n])
    head_variant_tma_store[(programs,)](a_desc, w_desc, bias, c_desc, m, n, k, NUM_PROGRAMS=programs,
                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
                                        HALVES=halves, num_warps=warps, num_stages=stages)
    return out


@triton.jit
def head_variant(a_desc, w_desc, bias_ptr, c_ptr, M, N, K, stride_cm, NUM_PROGRAMS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 HALVES: tl.constexpr, SPECIALIZE: tl.constexpr):
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    k_steps = (K + BLOCK_K - 1) // BLOCK_K
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=True, warp_specialize=SPECIALIZE):
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_m) * BLOCK_M
        off_n = ((tile % per_group) // group_m) * BLOCK_N
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k in range(k_steps):
            acc = tl.dot(a_desc.load([off_m, k * BLOCK_K]), w_desc.load([off_n, k * BLOCK_K]).T, acc)
        rm = off_m + tl.arange(0, BLOCK_M)
        if HALVES:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            rn = off_n + tl.arange(0, BLOCK_N // 2)
            left += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
            tl.store(c, left.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
            rn += BLOCK_N // 2
            right += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c += BLOCK_N // 2
            tl.store(c, right.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
        else:
            rn = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
            tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def run_variant(out, a, w, bias, block_m, block_n, block_k, group_m, warps, stages, halves, specialize, persistent):
    m, n = out.shape
    k = a.shape[1]
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    programs = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count) if persistent else tiles
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, block_k])
    w_desc = TensorDescriptor(w, [n, k], [w.stride(0), 1], [block_n, block_k])
    head_variant[(programs,)](a_desc, w_desc, bias, out, m, n, k, out.stride(0), NUM_PROGRAMS=programs,
                              BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, HALVES=halves,
                              SPECIALIZE=specialize, num_warps=warps, num_stages=stages)
    return out


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, halves, specialize, persistent); GROUP_M 32: every
# row tile of one weight tile in turn
VARIANTS = (
    (128, 256, 64, 8, 8, 3, False, False, True),  # biased_head.CONFIG before it stored through TMA
    (128, 256, 64, 8, 8, 3, True, False, True),
    (128, 256, 64, 32, 8, 3, False, False, True),
    (128, 256, 64, 32, 8, 3, True, False, True),
    (128, 256, 64, 8, 8, 4, True, False, True),
    (128, 256, 64, 32, 8, 4, True, False, True),
    (128, 256, 64, 8, 8, 3, False, False, False),
    (128, 256, 64, 8, 8, 3, True, False, False),
    (128, 256, 64, 8, 8, 3, False, True, True),
    (128, 256, 64, 8, 8, 3, True, True, True),
    (128, 128, 64, 8, 4, 4, False, False, False),
    (128, 128, 64, 8, 4, 4, False, False, True),
    (128, 128, 64, 8, 8, 4, True, False, False),
    (128, 128, 128, 8, 8, 3, True, False, False),
    (128, 256, 128, 8, 8, 2, True, False, True),
    (256, 128, 64, 8, 8, 3, True, False, True),
    (256, 128, 64, 32, 8, 3, True, False, True),
)

TMA_STORE_VARIANTS = (
    (128, 256, 64, 8, 8, 3, False),
    (128, 256, 64, 8, 8, 3, True),
    (128, 256, 64, 32, 8, 3, True),
    (128, 256, 64, 8, 8, 4, True),
    (128, 128, 64, 8, 4, 4, False),
    (128, 128, 64, 8, 8, 4, False),
    (256, 128, 64, 8, 8, 3, True),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=30522)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    n = args.vocab
    a = torch.randn(args.rows, args.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.05
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    reference = F.linear(a.float(), w.float(), bias.float())
    out = torch.empty(args.rows, n, device="cuda", dtype=torch.bfloat16)
    padded_w, padded_bias = F.pad(w, [0, 0, 0, -n % 8]), F.pad(bias, [0, -n % 8])
    print(f"head {args.rows} x {args.hidden} @ {args.hidden} x {n}, bf16, with a bias")
    print("| variant | us | max error |\n| --- | --- | --- |")
    print(f"| cuBLAS, weight already padded, contiguous padded rows | "
          f"{bench(lambda: F.linear(a, padded_w, padded_bias)):.0f} | |")
    print(f"| cuBLAS, weight padded in the call (Inductor's way) | "
          f"{bench(lambda: F.linear(a, F.pad(w, [0, 0, 0, -n % 8]), F.pad(bias, [0, -n % 8]))):.0f} | |")
    padded = torch.empty(args.rows, n + (-n % 8), device="cuda", dtype=torch.bfloat16)[:, :n]
    print(f"| biased_head.product_into (smelt today: into padded rows) | "
          f"{bench(lambda: biased_head.product_into(padded, a, w, bias)):.0f} | |")
    print("| into padded rows, TMA stores: (M, N, K, group, warps, stages, halves) | | |")
    for variant in TMA_STORE_VARIANTS:
        _time_variant(bench, lambda v=variant: run_tma_store(padded, a, w, bias, *v), padded, reference, variant)
    print("| into eager's rows, pointer stores: (M, N, K, group, warps, stages, halves, specialize, persistent) | | |")
    for variant in VARIANTS:
        _time_variant(bench, lambda v=variant: run_variant(out, a, w, bias, *v), out, reference, variant)


def _time_variant(bench, run, out, reference, variant) -> None:
    out.zero_()
    try:
        run()
        error = (out.float() - reference).abs().max().item()
        print(f"| {variant} | {bench(run):.0f} | {error:.4f} |", flush=True)
    except Exception as e:  # a config the compiler refuses (shared memory, no warp specialization)
        print(f"| {variant} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''} | |",
              flush=True)

if __name__ == "__main__":
    main()
