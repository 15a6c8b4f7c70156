"""smelt::short_attention alone against eager's products and softmax and Inductor's code for the
same chain (issue 22: Swin-T's window attention), at Swin-T's four stages (batch 32, bf16): the
shifted-window form (bias and per-window mask) and the plain one, us a call (do_bench median), the
kernel at a few (warps, matrices a program) pairs, with the bytes its operands move at the measured
copy bandwidth.

    python -m benchmarks.probes.short_attention [--batch 32] [--configs 2x1 4x1 4x2 8x4]
    python -m benchmarks.probes.short_attention --host   # no GPU needed: the host side of one call

--host times, on any machine, the host's part of a call of stage 1's shifted-window attention with the
kernel's launch left out: through torch.ops' dispatcher, and as compiled wrappers call it.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.measure import bench_ms, copy_bandwidth
from smelt.runtime import short_attention_kernel
from smelt.runtime.short_attention import short_attention

# Swin-T at 224: (windows per image, heads) per stage; 49 tokens a window, head size 32.
STAGES = [(64, 3), (16, 6), (4, 12), (1, 24)]


def chain(q, k, v, bias, mask):
    attn = (q * 0.25) @ k.transpose(-2, -1)
    attn = attn + bias
    if mask is not None:
        windows, heads, n = mask.shape[0], q.shape[1], q.shape[2]
        attn = attn.view(-1, windows, heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, heads, n, n)
    return attn.softmax(-1) @ v


def host_us(batch: int) -> None:
    import time

    from smelt.runtime import short_attention as op
    b_, heads, n, d = batch * 64, 3, 49, 32
    q, k, v = torch.empty(b_, n, 3, heads, d, dtype=torch.bfloat16).permute(2, 0, 3, 1, 4).unbind(0)
    terms = [torch.empty(1, heads, n, n, dtype=torch.bfloat16).expand(b_, heads, n, n),
             torch.empty(1, 64, 1, n, n, dtype=torch.bfloat16).expand(batch, 64, heads, n, n)]
    # The launch left out: the interpreted kernel's module with its kernel replaced by a no-op.
    module = op._kernels(q.device)
    module.short_attention = type("NoLaunch", (), {"__getitem__": lambda self, grid: lambda *a, **kw: None})()

    def best(fn, calls=2000):
        for _ in range(100):
            fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6
    dispatched = best(lambda: torch.ops.smelt.short_attention.default(q, k, v, terms, 0.177, 1.0, False, True, False))
    direct = best(lambda: op.call(q, k, v, terms, 0.177, 1.0, False, True, False))
    print(f"host us a call, launch left out: through torch.ops {dispatched:.1f}, as wrappers call it {direct:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--configs", nargs="+", default=["2x1", "4x1", "2x2", "4x2", "4x4"],
                        help="WARPSxMATRICES: warps a program, matrices a program")
    parser.add_argument("--host", action="store_true", help="only the host side of a call, on any machine")
    args = parser.parse_args()
    if args.host:
        host_us(args.batch)
        return
    dev, dtype, n, d = "cuda", torch.bfloat16, 49, 32
    bandwidth = copy_bandwidth(dev)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs]
    print("| stage | form | bytes floor us | eager | Inductor | " + " | ".join(
        f"smelt {w} warps x {m}" for w, m in configs) + " |")
    for stage, (windows, heads) in enumerate(STAGES, 1):
        for shifted in (False, True):
            if shifted and windows == 1:
                continue
            b_ = args.batch * windows
            qkv = torch.randn(b_, n, 3, heads, d, device=dev, dtype=dtype).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            bias = torch.randn(1, heads, n, n, device=dev, dtype=dtype)
            mask = torch.where(torch.rand(windows, n, n, device=dev) < 0.3, -100.0, 0.0).to(dtype) if shifted else None
            terms = [bias.expand(b_, heads, n, n)]
            if shifted:
                terms.append(mask.unsqueeze(1).unsqueeze(0).expand(args.batch, windows, heads, n, n))
            floor_us = 4 * b_ * heads * n * d * 2 / bandwidth * 1e6  # q, k, v read, the output written
            eager_us = bench_ms(lambda: chain(q, k, v, bias, mask), dev) * 1e3
            torch._dynamo.reset()
            compiled = torch.compile(chain)
            inductor_us = bench_ms(lambda: compiled(q, k, v, bias, mask), dev) * 1e3
            expected = chain(q, k, v, bias, mask)
            row = []
            for warps, matrices in configs:
                short_attention_kernel.NUM_WARPS, short_attention_kernel.MATRICES = warps, matrices
                out = short_attention(q, k, v, terms, 0.25, 1.0, False, True, False)
                error = (out.float() - expected.float()).abs().max().item()
                row.append(f"{bench_ms(lambda: short_attention(q, k, v, terms, 0.25, 1.0, False, True, False), dev) * 1e3:.1f} "
                           f"(err {error:.3g})")
            short_attention_kernel.NUM_WARPS, short_attention_kernel.MATRICES = 4, 1
            form = "shifted" if shifted else "plain"
            print(f"| {stage} [{b_}, {heads}, {n}, {d}] | {form} | {floor_us:.1f} | {eager_us:.1f} | {inductor_us:.1f} | "
                  + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
