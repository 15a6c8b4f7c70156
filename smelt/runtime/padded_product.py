"""smelt::padded_product: a matrix product whose N is not a multiple of 16 bytes, run as cuBLAS's
fast kernels need (every N it is given aligned), returned in eager's contiguous layout.

Where lowering/matmul_padding.py pads N so that cuBLAS runs its fast kernels, the caller of an
inference graph still gets the product in eager's strides, so its padded rows were copied out
whole: GPT-2's logits (8 x 512 x 50,257 bf16) then took twice their memory at the peak (the padded
product and the copy), 1.97x eager's for the model. Writing straight into the unpadded rows
(cuBLAS's out= through a strided view) gets the slow kernels again (3.2 against 1.3 ms on the H100).
So the product runs in blocks into a small scratch of aligned rows, each block copied into the
result.

`b` comes unpadded where the lowering could leave it so (a linear layer's weight, `t(w)`, a graph
input): its columns are then `w`'s rows, so any aligned run of them is a view cuBLAS reads with an
aligned leading dimension (K), and the product runs in blocks of columns, the last few columns
through a copy of only those, padded. The padded copy of the whole weight that the lowering made
before (GPT-2's [768, 50,264] bf16, 77 MB, every call; BERT's 47 MB) is not made, and the scratch is
COLUMN_SCRATCH_BYTES (or a quarter of the result, if less). Before, the padded weight and a 128 MB
row scratch beside the logits made the model suite's peaks (H100, real sizes, bf16 inference) 1.51x
eager's for GPT-2 and 1.67x for BERT; now 1.04x for both (the 16 MB scratch). The heads alone
(4096 x 768 rows; H100, us per call, peak MiB over the result's 393 / 239):

| head | eager, unpadded | weight padded, row blocks (before) | column blocks of 8 / 16 / 32 / 64 MB |
| --- | --- | --- | --- |
| GPT-2, 50,257 | 3327 | 1425, +201 | 1399 / 1014 / 1070 / 1031, +8 / +16 / +32 / +64 |
| BERT, 30,522 + bias | 800 | 1063, +173 | 1109 / 881 / 940 / 970, +8 / +16 / +32 / +60 |

A `b` that comes padded (a value whose producer wrote zero-padded rows, or a row-major one, padded
here) runs in blocks of rows through a scratch of SCRATCH_BYTES. On the H100, GPT-2's head in row
blocks (the weight already padded): 985-998 us whole and copied; in blocks of 64 MB 1072 us, 256 MB
1002 us.
"""
from typing import Optional

import torch

from . import unaligned_matmul

SCRATCH_BYTES = 128 << 20
COLUMN_SCRATCH_BYTES = 16 << 20
ALIGN_BYTES = 16


@torch.library.custom_op("smelt::padded_product", mutates_args=())
def padded_product(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """(bias +) a @ b, its first `n` columns, contiguous; a [M, K], b [K, N] with N = n or n padded,
    bias broadcastable to [M, N]."""
    m = a.shape[0]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if unaligned_matmul.applies(a, b, bias) and (bias is None or bias.stride(0) == 1):
        return unaligned_matmul.product_into(out, a, b, bias)  # one Triton kernel, no scratch (H100: see there)
    align = max(1, ALIGN_BYTES // a.element_size())
    if b.shape[1] == n and n % align:
        if b.stride(0) == 1 and b.stride(1) % align == 0 and b.stride(1) >= b.shape[0]:
            return _by_columns(a, b, bias, n, out, align)
        b = torch.nn.functional.pad(b, [0, -n % align])
    padded = b.shape[1]
    if bias is not None and bias.shape[-1] == n != padded:  # the lowering unpadded it, not `b`
        bias = torch.nn.functional.pad(bias, [0, padded - n])
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


def _by_columns(a, b, bias, n: int, out, align: int):
    """`b` column-major with an aligned leading dimension: aligned blocks of its columns, each into
    a scratch of aligned rows, then the last n % align columns padded to `align`."""
    m = a.shape[0]
    aligned = n - n % align
    # At most COLUMN_SCRATCH_BYTES, and a quarter of the result: a small result's scratch is not
    # as large as the result itself.
    width = max(align, min(aligned // 4, COLUMN_SCRATCH_BYTES // (m * a.element_size())) // align * align)
    scratch = torch.empty((m, width), dtype=a.dtype, device=a.device)
    full_bias = bias.expand(m, n) if bias is not None else None

    def product(columns, bias_columns, block):
        if bias_columns is None:
            torch.mm(a, columns, out=block)
        else:
            torch.addmm(bias_columns, a, columns, out=block)

    for start in range(0, aligned, width):
        end = min(aligned, start + width)
        block = scratch[:, :end - start]
        product(b[:, start:end], None if full_bias is None else full_bias[:, start:end], block)
        out[:, start:end].copy_(block)
    if aligned < n:
        pad = [0, align - (n - aligned)]
        tail = torch.nn.functional.pad(b[:, aligned:], pad)
        tail_bias = None if full_bias is None else torch.nn.functional.pad(full_bias[:, aligned:], pad)
        block = scratch[:, :align]
        product(tail, tail_bias, block)
        out[:, aligned:].copy_(block[:, :n - aligned])
    return out


@padded_product.register_fake
def _(a, b, bias, n):
    return a.new_empty((a.shape[0], n))
