"""Times SMELT_CUDA_BACKEND=halide against smelt's Triton kernels and eager on a few GPU workloads.

Prints one line per workload: the median ms of eager, smelt (Triton), smelt (Halide), and the
Halide kernels' relative error against eager. Run on a CUDA machine:
    python -m benchmarks.probes.halide_cuda_bench
"""
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import smelt  # noqa: F401

WORKLOADS = {
    "add 16M f32": (lambda a, b: a + b, lambda: (torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda"))),
    "gelu 16M bf16": (F.gelu, lambda: (torch.randn(1 << 24, device="cuda", dtype=torch.bfloat16),)),
    "softmax 4096x4096": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(4096, 4096, device="cuda"),)),
    "sum rows 8192x1024": (lambda x: x.sum(-1), lambda: (torch.randn(8192, 1024, device="cuda"),)),
    "sum cols 8192x1024": (lambda x: x.sum(0), lambda: (torch.randn(8192, 1024, device="cuda"),)),
    "layer_norm 8192x1024": (lambda x: F.layer_norm(x, (1024,)), lambda: (torch.randn(8192, 1024, device="cuda"),)),
    "transpose 4096x4096": (lambda x: x.t().contiguous(), lambda: (torch.randn(4096, 4096, device="cuda"),)),
}


def compiled(fn, backend):
    os.environ["SMELT_CUDA_BACKEND"] = backend
    torch._dynamo.reset()
    return torch.compile(fn, backend="smelt", dynamic=False)


def main():
    rows = []
    for name, (fn, make) in WORKLOADS.items():
        args = make()
        expected = fn(*args)
        times = [do_bench(lambda: fn(*args), return_mode="median")]
        error = None
        for backend in ("triton", "halide"):
            c = compiled(fn, backend)
            out = c(*args)
            if backend == "halide":
                error = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
            times.append(do_bench(lambda: c(*args), return_mode="median"))
        rows.append((name, *times, error))
    print(f"{'workload':24} {'eager ms':>9} {'triton ms':>9} {'halide ms':>9} {'rel err':>9}")
    for name, eager, triton, halide, error in rows:
        print(f"{name:24} {eager:9.4f} {triton:9.4f} {halide:9.4f} {error:9.1e}")


if __name__ == "__main__":
    main()
