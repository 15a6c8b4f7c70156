"""The LM head's TMA kernel (runtime/biased_head.py) at several tile configurations, storing into
padded rows (its TMA stores need 16-byte rows), against cuBLAS (issue 22). GPT-2's head has no bias: it
runs with a zero bias here, to time the kernel on its shape.

    python -m benchmarks.probes.head_sweep [--rows 4096] [--hidden 768]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.head_product import head_arguments
from smelt.runtime import biased_head

HEADS = (("gpt2", 50257), ("bert", 30522))
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
CONFIGS = ((128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4),
           (256, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 2))


def main(argv=None) -> None:
    args, bench = head_arguments(__doc__, argv)
    original = dict(biased_head.CONFIG)
    print("| head | config (M, N, K, group, warps, stages) | padded rows us | max error |")
    print("| --- | --- | --- | --- |")
    for name, n in HEADS:
        a = torch.randn(args.rows, args.hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, args.hidden, device="cuda", dtype=torch.bfloat16) * 0.05
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        reference = F.linear(a.float(), w.float(), bias.float())
        padded = torch.empty(args.rows, n + (-n % 8), device="cuda", dtype=torch.bfloat16)[:, :n]
        floor = F.pad(w, [0, 0, 0, -n % 8])
        print(f"| {name} ({n}) | cuBLAS, weight already padded | {bench(lambda: F.linear(a, floor)):.0f} | |")
        for m_, n_, k_, group, warps, stages in CONFIGS:
            biased_head.CONFIG.update(BLOCK_M=m_, BLOCK_N=n_, BLOCK_K=k_, GROUP_M=group, num_warps=warps,
                                      num_stages=stages)
            try:
                took = bench(lambda: biased_head.product_into(padded, a, w, bias))
                error = (padded.float() - reference).abs().max().item()
                print(f"| {name} | {m_}, {n_}, {k_}, {group}, {warps}, {stages} | {took:.0f} | {error:.4f} |")
            except Exception as e:  # a config the compiler refuses (shared memory)
                print(f"| {name} | {m_}, {n_}, {k_}, {group}, {warps}, {stages} | failed: {type(e).__name__} | |")
            finally:
                biased_head.CONFIG.clear()
                biased_head.CONFIG.update(original)


if __name__ == "__main__":
    main()
