"""The Triton kernel of smelt::short_attention (short_attention.py): softmax(q @ k^T + terms) @ v for
rows of at most 128 keys, one matrix a program, its scores never leaving registers.

Each value is rounded where eager's ops round it, so a half-float attention gives eager's result but
for the products' order of summation: the scaled query, the scores, each sum with an added term
and the probabilities are rounded to the inputs' dtype (a sum with a term to the term's: float32
terms of half-float q, as autocast adds Swin's bias table, keep the scores float32 up to the
softmax, its float32 probabilities rounded for the product); the softmax itself is float32, with
Triton's exp and division (a few float32 ulps, under the half float's rounding). A float32
attention agrees with eager's to a few ulps, not bit for bit: its products sum in another order
than cuBLAS's anyway.

A matrix m of the [*lead, Q, K] scores is found in each operand by its own lead dims: q, k, v and
the output share the scores' lead (at most 4 dims), each term is a view of the scores' shape in its
own lead (Swin's window mask is added at [batch, windows, heads, Q, K], its bias at [batch, heads,
Q, K]), expanded to it: a broadcast dim has stride 0.
"""
from __future__ import annotations

import dataclasses
import functools
import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger("smelt.runtime")

LEAD = 4  # lead dims each operand's index is split into, leading ones padded with size 1
NUM_WARPS = 4
MATRICES = 1  # matrices a program computes (benchmarks/probes/short_attention.py sweeps it)


@triton.jit
def _lead_offset(m, n1, n2, n3, s0, s1, s2, s3):
    # The offset of matrix m in an operand whose lead dims (row-major) have sizes (., n1, n2, n3).
    i3 = m % n3
    rest = m // n3
    i2 = rest % n2
    rest = rest // n2
    return (rest // n1) * s0 + (rest % n1) * s1 + i2 * s2 + i3 * s3


@triton.jit
def short_attention(q_ptr, k_ptr, v_ptr, t0_ptr, t1_ptr, out_ptr, Q, K, D, DV, q_scale, score_scale,
                    n1, n2, n3, qs0, qs1, qs2, qs3, qs_row, ks0, ks1, ks2, ks3, ks_row,
                    vs0, vs1, vs2, vs3, vs_row, os0, os1, os2, os3, os_row,
                    t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3, t0s_row,
                    t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3, t1s_row, M,
                    TERMS: tl.constexpr, EXACT_DOTS: tl.constexpr, SCALE_Q: tl.constexpr, SCALE_SCORES: tl.constexpr,
                    BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                    qs_col: tl.constexpr, ks_col: tl.constexpr, vs_col: tl.constexpr, os_col: tl.constexpr,
                    t0s_col: tl.constexpr, t1s_col: tl.constexpr, MATRICES: tl.constexpr):
    # The last dims' strides are constants (1 nearly always): loads of contiguous rows are vectorized
    # only where the compiler knows it (a runtime stride of 1 made the kernel 3x slower on the H200).
    # A program computes MATRICES of the M matrices, one after another (unrolled).
    for i in tl.static_range(MATRICES):
        m = tl.program_id(0).to(tl.int64) * MATRICES + i  # offsets of large operands pass 2**31
        if m < M:
            dtype = out_ptr.dtype.element_ty
            rq = tl.arange(0, BQ)
            rk = tl.arange(0, BK)
            rdv = tl.arange(0, BDV)
            in_q = rq < Q
            in_k = rk < K
            q, k_t, probs = _probabilities(m, q_ptr, k_ptr, t0_ptr, t1_ptr, Q, K, D, q_scale, score_scale, n1, n2, n3,
                                           qs0, qs1, qs2, qs3, qs_row, ks0, ks1, ks2, ks3, ks_row,
                                           t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3, t0s_row,
                                           t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3, t1s_row, dtype,
                                           TERMS, EXACT_DOTS, SCALE_Q, SCALE_SCORES, BQ, BK, BD,
                                           qs_col, ks_col, t0s_col, t1s_col)
            probs = probs.to(dtype)
            v_at = v_ptr + _lead_offset(m, n1, n2, n3, vs0, vs1, vs2, vs3)
            v = tl.load(v_at + rk[:, None] * vs_row + rdv[None, :] * vs_col,
                        mask=in_k[:, None] & (rdv[None, :] < DV), other=0.0)
            out = _product(probs, v, EXACT_DOTS)
            out_at = out_ptr + _lead_offset(m, n1, n2, n3, os0, os1, os2, os3)
            tl.store(out_at + rq[:, None] * os_row + rdv[None, :] * os_col, out.to(dtype),
                     mask=in_q[:, None] & (rdv[None, :] < DV))


@triton.jit
def _product(a, b, EXACT_DOTS: tl.constexpr):
    # Float32 products as eager's, not TF32; the interpreter's take no half floats (numpy has none).
    if EXACT_DOTS:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _probabilities(m, q_ptr, k_ptr, t0_ptr, t1_ptr, Q, K, D, q_scale, score_scale, n1, n2, n3,
                   qs0, qs1, qs2, qs3, qs_row, ks0, ks1, ks2, ks3, ks_row,
                   t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3, t0s_row,
                   t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3, t1s_row, dtype: tl.constexpr,
                   TERMS: tl.constexpr, EXACT_DOTS: tl.constexpr, SCALE_Q: tl.constexpr, SCALE_SCORES: tl.constexpr,
                   BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
                   qs_col: tl.constexpr, ks_col: tl.constexpr, t0s_col: tl.constexpr, t1s_col: tl.constexpr):
    # Matrix m's (scaled query [BQ, BD], k^T [BD, BK], probabilities [BQ, BK]), each rounded as eager's.
    rq = tl.arange(0, BQ)
    rk = tl.arange(0, BK)
    rd = tl.arange(0, BD)
    in_q = rq < Q
    in_k = rk < K
    q_at = q_ptr + _lead_offset(m, n1, n2, n3, qs0, qs1, qs2, qs3)
    q = tl.load(q_at + rq[:, None] * qs_row + rd[None, :] * qs_col, mask=in_q[:, None] & (rd[None, :] < D), other=0.0)
    if SCALE_Q:
        q = (q.to(tl.float32) * q_scale).to(dtype)
    k_at = k_ptr + _lead_offset(m, n1, n2, n3, ks0, ks1, ks2, ks3)
    k_t = tl.load(k_at + rd[:, None] * ks_col + rk[None, :] * ks_row, mask=(rd[:, None] < D) & in_k[None, :], other=0.0)
    scores = _product(q, k_t, EXACT_DOTS).to(dtype).to(tl.float32)
    if SCALE_SCORES == 1:
        scores = (scores * score_scale).to(dtype).to(tl.float32)
    if SCALE_SCORES == 2:
        scores = (scores / score_scale).to(dtype).to(tl.float32)
    inside = in_q[:, None] & in_k[None, :]
    if TERMS > 0:
        t0_at = t0_ptr + _lead_offset(m, t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3)
        t0 = tl.load(t0_at + rq[:, None] * t0s_row + rk[None, :] * t0s_col, mask=inside, other=0.0)
        scores = (scores + t0.to(tl.float32)).to(t0_ptr.dtype.element_ty).to(tl.float32)
    if TERMS > 1:
        t1_at = t1_ptr + _lead_offset(m, t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3)
        t1 = tl.load(t1_at + rq[:, None] * t1s_row + rk[None, :] * t1s_col, mask=inside, other=0.0)
        scores = (scores + t1.to(tl.float32)).to(t1_ptr.dtype.element_ty).to(tl.float32)
    # A row of -inf scores gives NaN, as eager's softmax does; columns past K take no weight.
    scores = tl.where(in_k[None, :], scores, float("-inf"))
    row_max = tl.reduce(scores, 1, tl.standard._elementwise_max)
    weights = tl.exp(scores - row_max[:, None])
    total = tl.reduce(weights, 1, tl.standard._sum_combine)
    return q, k_t, weights / total[:, None]  # float32: the callers round it


@triton.jit
def short_attention_backward(q_ptr, k_ptr, v_ptr, t0_ptr, t1_ptr, dout_ptr, dq_ptr, dk_ptr, dv_ptr, ds_ptr,
                             Q, K, D, DV, q_scale, score_scale,
                             n1, n2, n3, qs0, qs1, qs2, qs3, qs_row, ks0, ks1, ks2, ks3, ks_row,
                             vs0, vs1, vs2, vs3, vs_row, gs0, gs1, gs2, gs3, gs_row,
                             t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3, t0s_row,
                             t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3, t1s_row, M,
                             TERMS: tl.constexpr, EXACT_DOTS: tl.constexpr, SCALE_Q: tl.constexpr,
                             SCALE_SCORES: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr,
                             BDV: tl.constexpr, qs_col: tl.constexpr, ks_col: tl.constexpr, vs_col: tl.constexpr,
                             gs_col: tl.constexpr, t0s_col: tl.constexpr, t1s_col: tl.constexpr,
                             STORE_SCORE_GRADIENTS: tl.constexpr, FLOAT32_SOFTMAX: tl.constexpr,
                             MATRICES: tl.constexpr):
    # The gradients of q, k, v (contiguous [M, Q, D], [M, K, D], [M, K, DV]) and, where a term needs
    # one, of the scores after their scale ([M, Q, K], the terms' gradient before their broadcast is
    # summed), from the output's gradient (strides gs*), the probabilities computed again.
    for i in tl.static_range(MATRICES):
        m = tl.program_id(0).to(tl.int64) * MATRICES + i
        if m < M:
            dtype = dq_ptr.dtype.element_ty
            rq = tl.arange(0, BQ)
            rk = tl.arange(0, BK)
            rd = tl.arange(0, BD)
            rdv = tl.arange(0, BDV)
            in_q = rq < Q
            in_k = rk < K
            q, k_t, exact = _probabilities(m, q_ptr, k_ptr, t0_ptr, t1_ptr, Q, K, D, q_scale, score_scale, n1, n2, n3,
                                           qs0, qs1, qs2, qs3, qs_row, ks0, ks1, ks2, ks3, ks_row,
                                           t0n1, t0n2, t0n3, t0s0, t0s1, t0s2, t0s3, t0s_row,
                                           t1n1, t1n2, t1n3, t1s0, t1s1, t1s2, t1s3, t1s_row, dtype,
                                           TERMS, EXACT_DOTS, SCALE_Q, SCALE_SCORES, BQ, BK, BD,
                                           qs_col, ks_col, t0s_col, t1s_col)
            probs = exact.to(dtype)
            v_at = v_ptr + _lead_offset(m, n1, n2, n3, vs0, vs1, vs2, vs3)
            v_t = tl.load(v_at + rdv[:, None] * vs_col + rk[None, :] * vs_row,
                          mask=(rdv[:, None] < DV) & in_k[None, :], other=0.0)
            g_at = dout_ptr + _lead_offset(m, n1, n2, n3, gs0, gs1, gs2, gs3)
            g = tl.load(g_at + rq[:, None] * gs_row + rdv[None, :] * gs_col,
                        mask=in_q[:, None] & (rdv[None, :] < DV), other=0.0)
            # softmax's backward as eager's: float32 from the rounded probabilities and their gradient
            dp = _product(g, v_t, EXACT_DOTS).to(dtype).to(tl.float32)
            # A float32 softmax cast back (Llama's form) saves its float32 output for its backward.
            p = exact if FLOAT32_SOFTMAX else probs.to(tl.float32)
            ds = p * (dp - tl.reduce(dp * p, 1, tl.standard._sum_combine)[:, None])
            inside = in_q[:, None] & in_k[None, :]
            if STORE_SCORE_GRADIENTS:  # in the terms' dtype (float32 ones: the scores' before rounding)
                tl.store(ds_ptr + m * Q * K + rq[:, None] * K + rk[None, :], ds.to(ds_ptr.dtype.element_ty), mask=inside)
            d_raw = ds.to(dtype)  # the scaled scores' gradient, rounded, then the scale's backward
            if SCALE_SCORES == 1:
                d_raw = (d_raw.to(tl.float32) * score_scale).to(dtype)
            if SCALE_SCORES == 2:
                d_raw = (d_raw.to(tl.float32) / score_scale).to(dtype)
            dq = _product(d_raw, tl.trans(k_t), EXACT_DOTS).to(dtype)
            if SCALE_Q:
                dq = (dq.to(tl.float32) * q_scale).to(dtype)
            tl.store(dq_ptr + m * Q * D + rq[:, None] * D + rd[None, :], dq, mask=in_q[:, None] & (rd[None, :] < D))
            dk = _product(tl.trans(d_raw), q, EXACT_DOTS).to(dtype)
            tl.store(dk_ptr + m * K * D + rk[:, None] * D + rd[None, :], dk, mask=in_k[:, None] & (rd[None, :] < D))
            dv = _product(tl.trans(probs), g, EXACT_DOTS).to(dtype)
            tl.store(dv_ptr + m * K * DV + rk[:, None] * DV + rdv[None, :], dv, mask=in_k[:, None] & (rdv[None, :] < DV))


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot's operands are at least 16 wide


def _lead(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """Sizes and strides of `t`'s lead dims, padded in front to LEAD dims of size 1."""
    pad = LEAD - (t.dim() - 2)
    return [1] * pad + list(t.shape[:-2]), [0] * pad + list(t.stride()[:-2])


def run(q, k, v, terms, q_scale, score_scale, score_divides, out) -> torch.Tensor:
    """out[..., Q, DV] = softmax(q * q_scale @ k^T * score_scale + sum(terms)) @ v (the scores
    divided by score_scale where score_divides), rounded as eager rounds each op (a scale of 1: no
    such op)."""
    # Per call site the operands' sizes and strides repeat: what they decide is worked out once
    # (50 integer arguments took about 40 us of host a call to build, 11 more to describe).
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.stride(), q.dtype, k.dtype, v.dtype,
           q.device, q_scale, score_scale, score_divides, MATRICES, *[(t.shape, t.stride(), t.dtype) for t in terms])
    known = _launches.get(key)
    if known is None:
        if len(_launches) >= MAX_LAUNCHES:
            _launches.clear()
        args, constexprs = launch_arguments(q, k, v, terms, q_scale, score_scale, score_divides, out)
        known = _launches[key] = _Launch(triton.cdiv(q.shape[:-2].numel(), MATRICES), args[6:], constexprs)
    if known.programs == 0:
        return out
    t0 = terms[0] if terms else q
    t1 = terms[1] if len(terms) > 1 else q
    args = (q, k, v, t0, t1, out, *known.values)
    if not (q.is_cuda and _launch_binary(known, args, q.device.index, _binaries)):
        short_attention[(known.programs,)](*args, **known.constexprs, num_warps=NUM_WARPS)
    return out


def _launch_binary(known: "_Launch", args: tuple, device: int, variants) -> bool:
    """Launches through smelt's kept binaries and C launcher (Triton's JIT launch costs tens of us
    of host); whether it did. The binary for all the tensors 16-byte aligned is kept with the call
    site; any other is looked up by its arguments' description each call. `variants()`: the
    kernel's KernelVariants."""
    pointers = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            pointers |= a.data_ptr()
    binary = known.binaries.get(NUM_WARPS) if pointers & 15 == 0 else None
    if binary is None:
        from .kernel_binaries import Unsupported
        try:
            binary = variants().binary(args, known.constexprs, NUM_WARPS, device)
        except Unsupported as e:
            # Triton's JIT launches it instead, at tens of us of host a call: said once per call site.
            if pointers & 15 == 0:
                log.debug("smelt: short attention's %s launched through Triton's JIT: %s",
                          "backward" if variants is _backward_binaries else "forward", e)
            binary = False
        if pointers & 15 == 0:
            known.binaries[NUM_WARPS] = binary
    if binary:
        binary.launch((known.programs,), args, device)
    return bool(binary)


def run_backward(q, k, v, terms, dout, q_scale, score_scale, score_divides, store_score_gradients,
                 float32_softmax=False):
    """The gradients of q, k, v (contiguous, in q's, k's and v's shapes) and, with
    store_score_gradients, of the scores after their scale ([*lead, Q, K], None otherwise), given
    the output's gradient `dout`: the probabilities computed again, never saved."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    score_dtype = terms[0].dtype if terms else q.dtype
    ds = torch.empty((*q.shape[:-1], k.shape[-2]), dtype=score_dtype, device=q.device) if store_score_gradients else None
    key = ("backward", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), dout.stride(), q.dtype,
           k.dtype, v.dtype, dout.dtype, q.device, q_scale, score_scale, score_divides, store_score_gradients,
           float32_softmax, MATRICES, *[(t.shape, t.stride(), t.dtype) for t in terms])
    known = _launches.get(key)
    if known is None:
        if len(_launches) >= MAX_LAUNCHES:
            _launches.clear()
        forward, constexprs = launch_arguments(q, k, v, terms, q_scale, score_scale, score_divides, dout)
        constexprs = {("gs_col" if name == "os_col" else name): value for name, value in constexprs.items()}
        constexprs["STORE_SCORE_GRADIENTS"] = store_score_gradients
        constexprs["FLOAT32_SOFTMAX"] = float32_softmax
        known = _launches[key] = _Launch(triton.cdiv(q.shape[:-2].numel(), MATRICES), forward[6:], constexprs)
    if known.programs == 0:
        return dq, dk, dv, ds
    # The forward's arguments with the output's place taken by its gradient, the four results after it.
    t0 = terms[0] if terms else q
    t1 = terms[1] if len(terms) > 1 else q
    args = (q, k, v, t0, t1, dout, dq, dk, dv, ds if ds is not None else dq, *known.values)
    if not (q.is_cuda and _launch_binary(known, args, q.device.index, _backward_binaries)):
        short_attention_backward[(known.programs,)](*args, **known.constexprs, num_warps=NUM_WARPS)
    return dq, dk, dv, ds


MAX_LAUNCHES = 256  # call sites' geometries kept (sizes that change every call start over past it)


@dataclasses.dataclass
class _Launch:
    programs: int
    values: tuple  # the arguments after the six tensors
    constexprs: dict
    binaries: dict = dataclasses.field(default_factory=dict)  # warps -> the all-aligned binary (False: the JIT's)


_launches: dict[tuple, _Launch] = {}


def launch_arguments(q, k, v, terms, q_scale, score_scale, score_divides, out) -> tuple[tuple, dict]:
    """The kernel's runtime arguments and constexprs for these operands."""
    lead = _lead(q)[0]
    strides = []
    for t in (q, k, v, out):
        strides += _lead(t)[1] + [t.stride(-2)]
    term_args = []
    for i in range(2):
        if i < len(terms):
            sizes, lead_strides = _lead(terms[i])
            term_args += sizes[1:] + lead_strides + [terms[i].stride(-2)]
        else:
            term_args += [1, 1, 1, 0, 0, 0, 0, 0]
    t0 = terms[0] if terms else q
    t1 = terms[1] if len(terms) > 1 else q
    n_q, d = q.shape[-2:]
    n_k, dv = v.shape[-2:]
    matrices = q.shape[:-2].numel()
    args = (q, k, v, t0, t1, out, n_q, n_k, d, dv, float(q_scale), float(score_scale), *lead[1:], *strides, *term_args,
            matrices)
    constexprs = dict(TERMS=len(terms), EXACT_DOTS=not q.is_cuda or q.dtype == torch.float32,
                      SCALE_Q=q_scale != 1.0, SCALE_SCORES=0 if score_scale == 1.0 else 2 if score_divides else 1,
                      BQ=_block(n_q), BK=_block(n_k), BD=_block(d), BDV=_block(dv),
                      qs_col=q.stride(-1), ks_col=k.stride(-1), vs_col=v.stride(-1), os_col=out.stride(-1),
                      t0s_col=t0.stride(-1), t1s_col=t1.stride(-1), MATRICES=MATRICES)
    return args, constexprs


def _binaries():
    from .kernel_binaries import kept_in
    return _variants(short_attention, kept_in())


def _backward_binaries():
    from .kernel_binaries import kept_in
    return _variants(short_attention_backward, kept_in())


@functools.lru_cache(maxsize=None)
def _variants(fn, folder: str | None):
    """The kernel's binaries, kept in `folder`: where the latest assembled graph keeps its kernels."""
    from .kernel_binaries import KernelVariants
    with open(__file__, encoding="utf-8") as f:
        return KernelVariants(fn, f.read(), folder)
