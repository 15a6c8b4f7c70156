"""smelt::padded_product: a matrix product over zero-padded columns, returned without them, in
eager's contiguous layout, through a scratch buffer of a few row blocks.

Where lowering/matmul_padding.py pads N so that cuBLAS runs its fast kernels, the caller of an
inference graph still gets the product in eager's strides, so its padded rows were copied out
whole: GPT-2's logits (8 x 512 x 50,257 bf16) then took twice their memory at the peak (the padded
product and the copy), 1.97x eager's for the model. Writing straight into the unpadded rows
(cuBLAS's out= through a strided view) gets the slow kernels again (3.2 against 1.3 ms on the H100).
So the product runs in blocks of rows into a small padded scratch, each block copied into the
result: the fast kernels, one copy pass, and SCRATCH_BYTES of extra memory. On the H100, GPT-2's
head (4096 x 768 x 50,257 bf16): 985-998 us whole and copied; in blocks of 64 MB 1072 us, 256 MB
1002 us.
"""
from typing import Optional

import torch

SCRATCH_BYTES = 128 << 20


@torch.library.custom_op("smelt::padded_product", mutates_args=())
def padded_product(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """(bias +) a @ b, its first `n` columns, contiguous; a [M, K], b [K, N padded], bias
    broadcastable to [M, N padded]."""
    m, padded = a.shape[0], b.shape[1]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    rows = max(1, min(m, SCRATCH_BYTES // max(1, padded * a.element_size())))
    scratch = torch.empty((rows, padded), dtype=a.dtype, device=a.device)
    full_bias = bias.expand(m, padded) if bias is not None else None
    for start in range(0, m, rows):
        end = min(m, start + rows)
        block = scratch[:end - start]
        if full_bias is None:
            torch.mm(a[start:end], b, out=block)
        else:
            torch.addmm(full_bias[start:end], a[start:end], b, out=block)
        out[start:end].copy_(block[:, :n])
    return out


@padded_product.register_fake
def _(a, b, bias, n):
    return a.new_empty((a.shape[0], n))
