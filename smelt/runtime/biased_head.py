"""A half-float linear layer's product plus its bias, for smelt::padded_product (padded_product.py):
stored into the first N columns of rows padded to 16 bytes, the weight read in place.

cuBLAS adds a bias in its epilogue only when ATen hands it a contiguous result; the first N
columns of padded rows are not one, and ATen then copies the bias into them and reads it back
(BERT's head, 4096 x 768 @ 768 x 30,522 bf16 on the H200: 505 us, against 286-300 us for a
contiguous result over a weight already padded, and 351-356 us with the weight padded on every
call, 47 MB more at the peak). This kernel reads both operands and writes the result through TMA
descriptors (the weight's rows are aligned: its K is; the result's padded rows are): 320 us for
BERT's head (`benchmarks/probes/head_variants.py`, twenty-third session; into eager's unaligned
rows with pointer stores, as before, 383-389 us at best over 17 variants). Tiles of 128 x 256 x 64, 3
stages, 8 warps, persistent.

Each program walks tiles NUM_PROGRAMS apart, grouped GROUP_M rows of tiles at a time so that the
tiles resident at once share their blocks of A and W in L2. The tile's sum is float32; the bias is
added in float32 and the result rounded once, as cuBLAS's bias epilogue does.

The module imports no torch, so that a compile worker can load the kernel (jit_ahead.py: a graph
holding the head has it compiled while the graph is lowered, not at its first call).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


@triton.jit
def biased_head_product(a_desc, w_desc, bias_ptr, c_desc, M, N, K, NUM_PROGRAMS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # C[M, N] = A[M, K] @ W[N, K]^T + bias[N]; the descriptors clip every edge (zeros read, nothing written).
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    k_steps = (K + BLOCK_K - 1) // BLOCK_K
    per_group = GROUP_M * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        group_m = min(tiles_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % group_m) * BLOCK_M
        off_n = ((tile % per_group) // group_m) * BLOCK_N
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # not tl.zeros: a @jit helper the interpreter cannot call
        for k in range(k_steps):  # the descriptors read zeros past each edge
            acc = tl.dot(a_desc.load([off_m, k * BLOCK_K]), w_desc.load([off_n, k * BLOCK_K]).T, acc)
        rn = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def applies(out, a, w, bias) -> bool:
    """Half floats on a CUDA device, `w` row-major [N, K], `a` [M, K] and `out` [M, N] in rows TMA
    can read and write (16-byte aligned), a contiguous bias of one row."""
    import torch
    return (a.is_cuda and a.dtype in (torch.float16, torch.bfloat16) and w.dtype == a.dtype == bias.dtype == out.dtype
            and a.dim() == w.dim() == out.dim() == 2 and bias.dim() == 1 and bias.stride(0) == 1
            and all(_tma_rows(t) for t in (a, w, out)))


def _tma_rows(t) -> bool:
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and _address(t) % 16 == 0


def _address(t) -> int:
    """A tensor's address; 0 for a fake one (a graph's planned value: smelt's buffers are aligned)."""
    from torch._subclasses.fake_tensor import is_fake
    return 0 if is_fake(t) else t.data_ptr()


def product_into(out, a, w, bias):
    """out = a @ w[:N].T + bias[:N], N = out's columns (w and bias may have more rows: padded); out's
    rows 16-byte aligned (the first N columns of padded rows)."""
    from smelt.runtime.jit_ahead import wait_for
    launch = _launch(out, a, w, bias, a, w, bias, out)
    wait_for(biased_head_product)
    biased_head_product[launch.kwargs.pop("grid")](*launch.args, **launch.kwargs)
    return out


def ahead_launches(out, a, w, bias) -> list:
    """The launch product_into(out, a, w, bias) will make, for tensors as the graph plans them
    (fake ones): its specialization, for jit_ahead.py."""
    from smelt.runtime.jit_ahead import Stand
    if not applies(out, a, w, bias):
        return []
    launch = _launch(out, a, w, bias, *(Stand(t.dtype) for t in (a, w, bias, out)))
    del launch.kwargs["grid"]
    return [launch]


def _launch(out, a, w, bias, a_base, w_base, bias_arg, out_base):
    """The kernel's launch over these shapes, its tensors given by the *_base / bias_arg arguments."""
    import torch
    from smelt.runtime.jit_ahead import Launch
    m, n = out.shape
    k = a.shape[1]
    config = dict(CONFIG)
    warps, stages = config.pop("num_warps"), config.pop("num_stages")
    tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
    programs = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count) if a.is_cuda else tiles
    a_desc = TensorDescriptor(a_base, [m, k], [a.stride(0), 1], [config["BLOCK_M"], config["BLOCK_K"]])
    w_desc = TensorDescriptor(w_base, [n, k], [w.stride(0), 1], [config["BLOCK_N"], config["BLOCK_K"]])
    c_desc = TensorDescriptor(out_base, [m, n], [out.stride(0), 1], [config["BLOCK_M"], config["BLOCK_N"]])
    return Launch(biased_head_product, (a_desc, w_desc, bias_arg, c_desc, m, n, k),
                  dict(NUM_PROGRAMS=programs, num_warps=warps, num_stages=stages, grid=(programs,), **config))
