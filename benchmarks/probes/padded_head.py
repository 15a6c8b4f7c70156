"""GPT-2's LM head, [4096, 768] x [768, 50257] bf16, returned in eager's contiguous layout: the ways
to run a product whose N is misaligned for cuBLAS (us per call, extra peak memory), then
smelt::padded_product (runtime/padded_product.py) at a few block sizes against the whole padded
product and its copy. On the GPU.

    python -m benchmarks.probes.padded_head
"""
from __future__ import annotations

import torch
import triton.testing

from smelt.runtime import padded_product

M, K, N = 4096, 768, 50257
PADDED = N + (-N % 8)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    w_padded = torch.nn.functional.pad(w.t(), [0, PADDED - N]).contiguous()
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    scratch = torch.empty(M, PADDED, device="cuda", dtype=torch.bfloat16)

    def into_view():
        torch.mm(x, w.t(), out=scratch[:, :N])
        return out.copy_(scratch[:, :N])

    ways = {
        "unpadded (align-1 kernels)": lambda: torch.mm(x, w.t()),
        "weight padded, product whole, copied out": lambda: torch.mm(
            x, torch.nn.functional.pad(w.t(), [0, PADDED - N]))[:, :N].contiguous(),
        "out= a strided view of padded rows, copied out": into_view,
        "weight padded already, product whole, copied out": lambda: torch.mm(x, w_padded)[:, :N].contiguous(),
    }
    for megabytes in (64, 128, 256):
        ways[f"padded_product, {megabytes} MB blocks"] = (
            lambda mb=megabytes: (setattr(padded_product, "SCRATCH_BYTES", mb << 20),
                                  torch.ops.smelt.padded_product(x, w_padded, None, N))[1])
    for name, f in ways.items():
        f()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(f, return_mode="median")
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        f()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"{name:52s} {ms * 1e3:8.1f} us   extra peak {extra:7.1f} MiB   {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
