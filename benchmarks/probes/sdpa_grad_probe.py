"""Gradients through F.scaled_dot_product_attention under smelt against eager, for each CUDA
kernel sdpa can pick (flash, efficient, cudnn, math) and mask form; the first failing case is dumped
with SMELT_DEBUG_DIR when --dump is given."""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import smelt  # noqa: F401


def cosine(a, b):
    a, b = a.float().flatten(), b.float().flatten()
    return (a @ b / (a.norm() * b.norm() + 1e-30)).item()


def case(kernel, mask, dtype, pre):
    torch.manual_seed(0)
    B, H, L, D = 2, 4, 128, 64
    x = torch.randn(B, L, 3 * H * D, device="cuda", dtype=dtype, requires_grad=True)
    bias = torch.randn(L, L, device="cuda", dtype=dtype) if mask == "float" else None

    def f(x):
        q, k, v = (x * 1.5 if pre else x).split(H * D, dim=2)
        q, k, v = (t.view(B, L, H, D).transpose(1, 2) for t in (q, k, v))
        kw = {"is_causal": True} if mask == "causal" else {"attn_mask": bias} if mask == "float" else {}
        with sdpa_kernel([kernel]):
            y = F.scaled_dot_product_attention(q, k, v, **kw)
        return y.transpose(1, 2).reshape(B, L, H * D)

    g = torch.randn(B, L, H * D, device="cuda", dtype=dtype)
    out_e = f(x)
    (gx_e,) = torch.autograd.grad(out_e, x, g)
    torch._dynamo.reset()
    out_a = torch.compile(f, backend="smelt")(x)
    (gx_a,) = torch.autograd.grad(out_a, x, g)
    return cosine(out_a, out_e), cosine(gx_a, gx_e)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dump", default=None)
    args = p.parse_args()
    dumped = False
    for kernel in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                   SDPBackend.MATH):
        for mask in ("none", "causal", "float"):
            for dtype in (torch.bfloat16, torch.float32):
                for pre in (False, True):
                    try:
                        oc, gc = case(kernel, mask, dtype, pre)
                    except Exception as exc:  # noqa: BLE001 - a kernel that does not take this case
                        print(f"{kernel.name:20s} {mask:6s} {str(dtype):15s} pre={pre}: n/a ({type(exc).__name__}: {str(exc)[:100]})")
                        continue
                    bad = gc < 0.999
                    print(f"{kernel.name:20s} {mask:6s} {str(dtype):15s} pre={pre}: out cos {oc:.5f} grad cos {gc:.5f}"
                          f"{'  WRONG' if bad else ''}", flush=True)
                    if bad and args.dump and not dumped:
                        os.environ["SMELT_DEBUG_DIR"] = args.dump
                        case(kernel, mask, dtype, pre)
                        del os.environ["SMELT_DEBUG_DIR"]
                        dumped = True


if __name__ == "__main__":
    main()
