"""smelt::padded_product: a matrix product whose N is not a multiple of 16 bytes, returned as the first
N columns of rows padded to an aligned length, as cuBLAS's fast kernels write them.

cuBLAS's tensor-core kernels need every leading dimension and N itself aligned: GPT-2's head
(8 x 512 x 50,257 bf16 logits) takes 3.3 ms on the H100 written into its unaligned rows, or into
aligned rows with N unaligned, and 0.50 ms with N padded. lowering/matmul_padding.py pads such
products; an inference graph's logits, read by nothing but the caller, come here, and the caller
gets them as a view of the padded rows (strides (N + pad, 1)), as Inductor returns them. Returning
them in eager's unpadded rows cost a copy of the whole product (or, before, a Triton kernel storing
into the unaligned rows: 0.88 ms for GPT-2's head, 0.44 for BERT's).

A `b` that is a weight's transpose (`t(w)`: column-major with an aligned leading dimension) is
read in place: its first N - N % align columns in one product, straight into the padded rows, and
its last few through a padded copy of only those, so the whole weight is never copied (GPT-2's
77 MB a call, Inductor's way): 458 us on the H200 against 503 for cuBLAS over a weight already
padded. A product plus a bias vector on CUDA is where cuBLAS is no help: it adds the bias in its
epilogue only into a contiguous result, which the padded rows' first N columns are not (BERT's head on
the H200, `benchmarks/probes/head_product.py`: 505 us into the strided columns; 352 with the whole
weight padded on every call, Inductor's way, whose 47 MB copy stood beside the logits at an inference
call's peak: 1.16x eager's). A half-float one goes through biased_head.py's TMA kernel (320 us, the
weight read in place, the peak eager's); any other pads the whole weight. A `b` that comes padded is
read whole; any other is padded here.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from . import jit_ahead

ALIGN_BYTES = 16
HALF_FLOATS = (torch.float16, torch.bfloat16)


def padded_width(n: int, element_size: int) -> int:
    align = max(1, ALIGN_BYTES // element_size)
    return n + (-n % align)


@torch.library.custom_op("smelt::padded_product", mutates_args=())
def padded_product(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """(bias +) a @ b, its first `n` columns, in rows of padded_width(n) elements; a [M, K],
    b [K, N] with N = n or n padded, bias broadcastable to [M, N] (zero past n where N > n)."""
    m = a.shape[0]
    width = padded_width(n, a.element_size())
    rows = torch.empty((m, width), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return rows[:, :n]
    align = max(1, ALIGN_BYTES // a.element_size())
    if b.shape[1] >= width:
        _product(a, b[:, :width], _columns(bias, 0, width), rows)
    elif _biased_head(rows[:, :n], a, b, bias):
        pass  # the TMA kernel stored it
    elif (b.stride(0) == 1 and b.stride(1) % align == 0 and b.stride(1) >= b.shape[0]
          and not (a.is_cuda and _is_vector(bias))):
        aligned = n - n % align
        if aligned:
            _product(a, b[:, :aligned], _columns(bias, 0, aligned), rows[:, :aligned])
        if aligned < n:
            _product(a, _padded(b[:, aligned:n], width - aligned), _columns(bias, aligned, width), rows[:, aligned:])
    else:
        _product(a, _padded(b[:, :n], width), _columns(bias, 0, width), rows)
    return rows[:, :n]


def _biased_head(out, a, b, bias) -> bool:
    """out = a @ b + bias by biased_head.py's kernel, where it applies: a half-float weight's
    transpose and a bias vector on CUDA. Whether it ran."""
    if not _head_may_apply(a, b, bias):
        return False
    from . import biased_head  # Triton, imported only where it runs
    if not biased_head.applies(out, a, b.t(), bias):
        return False
    biased_head.product_into(out, a, b.t(), bias)
    return True


def _head_may_apply(a, b, bias) -> bool:
    return _is_vector(bias) and a.is_cuda and a.dtype in HALF_FLOATS and b.dim() == 2 and b.stride(0) == 1


def _ahead_launches(a, b, bias, n) -> list:
    """The Triton JIT launches padded_product(a, b, bias, n) will make, for its planned (fake)
    arguments: biased_head.py's, compiled ahead by jit_ahead.py."""
    tensors = [t for t in (a, b, bias) if t is not None]
    if not all(isinstance(x, int) for t in tensors for x in (*t.shape, *t.stride())) or not isinstance(n, int):
        return []  # symbolic sizes: compiled at the first call
    width = padded_width(n, a.element_size())
    if a.shape[0] == 0 or n == 0 or b.shape[1] >= width or not _head_may_apply(a, b, bias):
        return []
    from . import biased_head
    out = a.new_empty((a.shape[0], width))[:, :n]
    return biased_head.ahead_launches(out, a, b.t(), bias)


jit_ahead.register(torch.ops.smelt.padded_product.default, _ahead_launches)


def _is_vector(bias) -> bool:
    return bias is not None and bias.dim() == 1 and bias.shape[0] > 1


def _padded(b, width: int):
    """`b` with zero columns up to `width`, copied in its own layout: a weight's transpose stays one
    (a straight copy of the weight's rows, not a transposing one)."""
    if b.stride(0) == 1 and b.shape[1] > 1:
        return F.pad(b.t(), [0, 0, 0, width - b.shape[1]]).t()
    return F.pad(b, [0, width - b.shape[1]])


def _product(a, b, bias, out) -> None:
    if bias is None:
        torch.mm(a, b, out=out)
    else:
        torch.addmm(bias, a, b, out=out)


def _columns(bias, start: int, end: int):
    """Columns start..end of `bias` as broadcast to the product, zeros past its last column."""
    if bias is None or bias.shape[-1] == 1:
        return bias
    have = bias.shape[-1]
    taken = bias[..., start:min(end, have)]
    return F.pad(taken, [0, end - have]) if end > have else taken


@padded_product.register_fake
def _(a, b, bias, n):
    width = padded_width(n, a.element_size())
    return a.new_empty((a.shape[0], width))[:, :n]
