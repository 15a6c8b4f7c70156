"""Random hand-written attention chains against eager (lowering/handwritten_attention.py): values and
gradients of q, k, v and a learned mask or bias, over the forms of tests/test_handwritten_attention.py,
sizes down to one query or key, and masks of every broadcast shape (padding, random, learned, fills).

    python -m benchmarks.probes.attention_rewrite_fuzz [SEED] [COUNT] [infer] [bf16]

With `infer` the chains run under no_grad and only values are compared: with SMELT_CPU_BACKEND=triton
(the GPU's target) those under 64 keys run as smelt::short_attention (runtime/short_attention.py),
counted per case as `short=`. With `bf16`, q, k and v are bfloat16, the masks stay float32 and the
chains run under autocast: the masks promote the scores to float32, the float32 probabilities are
cast for the product with v (autocast's Swin; errors relative to the largest value, FAIL past 3e-2,
bfloat16's few ulps). Prints a line per case (FAIL past 1e-4), then how many differed.
"""
import os
import random
import sys

import torch

import smelt  # noqa: F401
import smelt.backend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from test_handwritten_attention import (albert, deberta, divided_methods, filled_only,  # noqa: E402
                                        float32_softmax, three_dimensional)

from smelt.runtime import short_attention as short_op  # noqa: E402

INFER = "infer" in sys.argv[3:]
HALF = "bf16" in sys.argv[3:]
DTYPE, LIMIT = (torch.bfloat16, 3e-2) if HALF else (torch.float32, 1e-4)
counts, short_runs = [], []
real = smelt.backend.handwritten_attention_to_sdpa
def counting(gm, *args):
    counts.append(real(gm, *args)); return counts[-1]
smelt.backend.handwritten_attention_to_sdpa = counting
real_kernels = short_op._kernels
def counting_kernels(device):
    short_runs.append(device); return real_kernels(device)
short_op._kernels = counting_kernels

def scale_on_q(q, k, v, mask):  # scale applied to q before the product
    q = q * (q.shape[-1] ** -0.5)
    return torch.softmax(q @ k.transpose(-2, -1) + mask, dim=-1) @ v

def scale_div_after_mask(q, k, v, mask):  # mask added, then scaled: not SDPA's order
    return torch.softmax((q @ k.transpose(-2, -1) + mask) / 3.0, dim=-1) @ v

def per_window(q, k, v, mask):  # Swin's shifted windows: a second term added per window, batch = windows
    b, h, qn, kn = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    extra = torch.randn(b, qn, kn, generator=torch.Generator().manual_seed(0)) * 2
    s = q @ k.transpose(-2, -1) * 0.5 + mask
    s = (s.view(-1, b, h, qn, kn) + extra.unsqueeze(1).unsqueeze(0)).view(b, h, qn, kn)
    return torch.softmax(s, dim=-1) @ v

ADDITIVE = [albert, divided_methods, float32_softmax, scale_on_q, scale_div_after_mask, per_window]
FILLED = [deberta, filled_only]

def case(rng, seed):
    torch.manual_seed(seed)
    b, h = rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
    qn, kn, d = rng.choice([1, 3, 8, 17]), rng.choice([1, 5, 8, 16]), rng.choice([4, 8, 16, 32])
    kind = rng.choice(["additive", "additive", "filled", "three_d"])
    q, k, v = (torch.randn(b, h, n, d, dtype=DTYPE, requires_grad=True) for n in (qn, kn, kn))
    leaves = [q, k, v]
    if kind == "additive":
        form = rng.choice(ADDITIVE)
        shape = rng.choice([(b, 1, 1, kn), (b, 1, qn, kn), (1, h, qn, kn), (b, h, qn, kn)])
        how = rng.choice(["padding", "random", "learned", "zeros"])
        if how == "padding":
            keep = torch.rand(shape) > 0.3
            keep[..., 0] = True  # every entry keeps a key (no-key entries: a documented deviation)
            mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        elif how == "random":
            mask = torch.randn(shape) * 3
        elif how == "learned":
            mask = torch.randn(shape, requires_grad=True); leaves.append(mask)
        else:
            mask = torch.zeros(shape)
        args = (q, k, v, mask)
        name = f"{form.__name__}/{how}{list(shape)}"
    elif kind == "filled":
        form = rng.choice(FILLED)
        bias = torch.randn(b, h, qn, kn, requires_grad=form is deberta)
        if form is deberta: leaves.append(bias)
        keep = torch.rand(rng.choice([(b, 1, qn, kn), (b, 1, 1, kn), (b, h, qn, kn)])) > rng.choice([0.2, 0.5, 0.9])
        args = (q, k, v, bias, keep)
        name = f"{form.__name__}/keep{list(keep.shape)} kept {keep.float().mean():.2f}"
    else:
        form = three_dimensional
        args = (q, k, v, torch.zeros(()))
        name = "three_dimensional"
    return form, args, leaves, name + f" b{b} h{h} q{qn} k{kn} d{d}"

def check(form, args, leaves):
    counts.clear()
    short_runs.clear()
    torch._dynamo.reset()
    if INFER:
        with torch.no_grad():
            expected, actual = form(*args), torch.compile(form, backend="smelt")(*args)
        return [_error(actual, expected)], list(counts)
    expected = form(*args)
    g = torch.randn_like(expected)
    want = torch.autograd.grad(expected, leaves, g, allow_unused=True)
    actual = torch.compile(form, backend="smelt")(*args)
    got = torch.autograd.grad(actual, leaves, g, allow_unused=True)
    errs = [_error(actual, expected)]
    for a, w in zip(got, want):
        if w is None and a is None: continue
        a = torch.zeros_like(w) if a is None else a
        w = torch.zeros_like(a) if w is None else w
        errs.append(((a.float() - w.float()).abs().max() / (1 + w.float().abs().max())).item())
    return errs, list(counts)

def _error(actual, expected):
    diff = (actual.float() - expected.float()).abs().max()
    return (diff / (1 + expected.float().abs().max()) if HALF else diff).item()

def check_in_autocast(form, args, leaves):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=HALF):
        return check(form, args, leaves)

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
n = int(sys.argv[2]) if len(sys.argv) > 2 else 50
bad = 0
for i in range(n):
    form, args, leaves, name = case(rng, i)
    try:
        errs, rw = check_in_autocast(form, args, leaves)
    except Exception as e:
        print(f"ERROR {i} {name}: {type(e).__name__}: {str(e)[:200]}"); bad += 1; continue
    worst = max(errs)
    flag = "FAIL" if worst > LIMIT or any(e != e for e in errs) else "ok"
    if flag != "ok": bad += 1
    print(f"{flag} {i} {name} rewrites={rw} short={len(short_runs)} errs={[f'{e:.1e}' for e in errs]}", flush=True)
print(f"{bad} bad of {n}")
