"""smelt::short_attention: attention over rows of few keys (Swin's 7 x 7 windows: 49), written out
by hand in the model, as one Triton kernel (short_attention_kernel.py), and its backward as another.

Eager computes such an attention as a batched product, a softmax and a second product, writing the
[*lead, Q, K] scores and probabilities to memory between them; PyTorch's fused attention kernels
work on tiles of 64 keys and more and took longer than that (Swin-T on the H200: 3.72 GPU ms a call
with 7 of its 12 attentions through cuDNN's, 3.48 as written; RESULTS, twenty-fourth session).
Here a program computes one matrix's scores, its softmax and the product with v in registers: q, k,
v and the terms are read once, the output written once. lowering/handwritten_attention.py puts it
in where a Target asks for it (Target.short_attention_kernel; in training graphs, with its backward
below, Target.short_attention_training).

The output is [*lead, Q, DV]; with `heads_last` (two lead dims, the caller's next ops a transpose of
them and a reshape concatenating the heads per query) it is stored as [lead0, Q, lead1, DV] memory,
so that both are views.
"""
from __future__ import annotations

import torch

MAX_ROWS = 128  # queries, keys and head sizes whose whole tiles stay in registers


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: list[torch.Tensor]) -> bool:
    """Whether the kernel takes these operands (shapes as the op takes them, see below)."""
    if q.dim() < 3 or q.dim() - 2 > 4 or len(terms) > 2:
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32)):
        return False
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead or k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2]:
        return False
    if max(q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]) > MAX_ROWS or k.shape[-2] == 0:
        return False  # (no keys: eager's result is zeros, a softmax over nothing is NaN)
    scores = (*lead, q.shape[-2], k.shape[-2])
    # Terms of q's dtype, or all float32: half-float scores promoted by them (autocast's Swin).
    if terms and not (terms[0].dtype in (q.dtype, torch.float32) and all(t.dtype == terms[0].dtype for t in terms)):
        return False
    if not all(2 < t.dim() <= 6 and t.shape[-2:] == scores[-2:] and t.shape[:-2].numel() == lead.numel()
               for t in terms):
        return False
    # The kernel finds a matrix in int64 but its rows and columns in int32: one matrix's elements of
    # each operand must lie within 2**31 of its first (a wider view read wrapped offsets: a crash).
    return all(sum((size - 1) * abs(stride) for size, stride in zip(t.shape[-2:], t.stride()[-2:])) < 2 ** 31
               for t in (q, k, v, *terms))


@torch.library.custom_op("smelt::short_attention", mutates_args=())
def short_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: list[torch.Tensor],
                    q_scale: float, score_scale: float, score_divides: bool, heads_last: bool,
                    float32_softmax: bool) -> torch.Tensor:
    """softmax((q * q_scale) @ k^T * score_scale + terms[0] + terms[1]) @ v (the scores divided by
    score_scale where score_divides), each op rounded as eager rounds it: float32 terms of half-float
    q add in float32, the softmax float32, its result rounded for the product. q [*lead, Q, D],
    k [*lead, K, D], v [*lead, K, DV]; each term [*its lead, Q, K], its lead a row-major split of
    q's (an expanded view where it broadcasts). `float32_softmax`: the chain's softmax is a float32
    one cast back to half floats (Llama's form), whose backward reads the unrounded probabilities."""
    if not applies(q, k, v, terms):
        raise ValueError(f"smelt::short_attention does not take q {tuple(q.shape)} {q.stride()} {q.dtype}, "
                         f"k {tuple(k.shape)} {k.stride()}, v {tuple(v.shape)} {v.stride()} with {len(terms)} terms "
                         "(see short_attention.applies)")
    return call(q, k, v, terms, q_scale, score_scale, score_divides, heads_last)


def call(q, k, v, terms, q_scale, score_scale, score_divides, heads_last, float32_softmax=False) -> torch.Tensor:
    """The op without the dispatcher (about 20 us of host a call on the 2-core CPU, `python -m
    benchmarks.probes.short_attention --host`): what compiled wrappers call."""
    out = _empty_output(q, v, heads_last)
    _kernels(q.device).run(q, k, v, terms, q_scale, score_scale, score_divides, out)
    return out


@short_attention.register_fake
def _(q, k, v, terms, q_scale, score_scale, score_divides, heads_last, float32_softmax):
    return _empty_output(q, v, heads_last)


@torch.library.custom_op("smelt::short_attention_backward", mutates_args=())
def short_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: list[torch.Tensor],
                             grad: torch.Tensor, q_scale: float, score_scale: float, score_divides: bool,
                             score_gradients: bool, float32_softmax: bool
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k and v, and with `score_gradients` of the scores after their scale
    ([*lead, Q, K] in the terms' dtype: each added term's, before its broadcast is summed; else an
    empty tensor), from the output's gradient: the probabilities are computed again from q, k and
    the terms, never saved."""
    return call_backward(q, k, v, terms, grad, q_scale, score_scale, score_divides, score_gradients, float32_softmax)


def call_backward(q, k, v, terms, grad, q_scale, score_scale, score_divides, score_gradients, float32_softmax):
    """The backward op without the dispatcher (what compiled wrappers call; through torch.ops a
    Swin training step's 12 calls took about 2 ms of the H200 host's time, cProfile)."""
    dq, dk, dv, ds = _kernels(q.device).run_backward(q, k, v, list(terms), grad, q_scale, score_scale, score_divides,
                                                     score_gradients, float32_softmax)
    return dq, dk, dv, ds if ds is not None else q.new_empty(0, dtype=_score_dtype(q, terms))


@short_attention_backward.register_fake
def _(q, k, v, terms, grad, q_scale, score_scale, score_divides, score_gradients, float32_softmax):
    scores = (*q.shape[:-1], k.shape[-2]) if score_gradients else (0,)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), q.new_empty(scores, dtype=_score_dtype(q, terms))


def _score_dtype(q: torch.Tensor, terms) -> torch.dtype:
    """The dtype of the scores the terms are added to (their gradient's)."""
    return terms[0].dtype if terms else q.dtype


def _setup_context(ctx, inputs, output):
    q, k, v, terms, q_scale, score_scale, score_divides, _, float32_softmax = inputs
    ctx.save_for_backward(q, k, v, *terms)
    ctx.scales = (q_scale, score_scale, score_divides)
    ctx.float32_softmax = float32_softmax
    ctx.term_gradients = [t.requires_grad for t in terms]


def _backward(ctx, grad):
    q, k, v, *terms = ctx.saved_tensors
    wanted = any(ctx.term_gradients)
    dq, dk, dv, ds = short_attention_backward(q, k, v, terms, grad, *ctx.scales, wanted, ctx.float32_softmax)
    # A term is an expanded view of the scores' shape: its gradient is theirs, summed by the expand's
    # backward. Each term gets its own tensor (two full-shape leaves' .grad must not share memory).
    term_grads, given = [], False
    for t, needs in zip(terms, ctx.term_gradients):
        term_grads.append((ds.clone() if given else ds).view(t.shape) if needs else None)
        given = given or needs
    return dq, dk, dv, term_grads, None, None, None, None, None


short_attention.register_autograd(_backward, setup_context=_setup_context)


def _empty_output(q: torch.Tensor, v: torch.Tensor, heads_last: bool) -> torch.Tensor:
    shape = (*q.shape[:-1], v.shape[-1])
    if heads_last and len(shape) == 4:
        b, h, n, d = shape
        return q.new_empty((b, n, h, d)).permute(0, 2, 1, 3)
    return q.new_empty(shape)


def _kernels(device: torch.device):
    """The kernel's module: compiled for the GPU, or run by Triton's interpreter for CPU tensors
    (the Triton backend's CPU graphs, which test the GPU's plans)."""
    from . import short_attention_kernel
    if device.type == "cuda":
        return short_attention_kernel
    from .loader import load_module
    return load_module(short_attention_kernel.__file__, interpret=True)
