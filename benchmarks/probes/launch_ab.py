"""Kernel launches from C (runtime/launch_ext.c) against ctypes, alternating in one process: the
same compiled model timed with the C launcher, with launches through ctypes, and Inductor's, three
rounds (do_bench medians, us per call). On the GPU.

    python -m benchmarks.probes.launch_ab
"""
from __future__ import annotations

import torch
import torchvision
import triton.testing

import smelt  # noqa: F401  (registers the backend)
from smelt.runtime import cuda_binary

from .cuda_graphs import model


def main() -> None:
    torch._dynamo.config.cache_size_limit = 64
    cases = {"8-layer one-token model": (model(8, 512).eval(), torch.randn(1, 1, 512, device="cuda"))}
    resnet = torchvision.models.resnet50().cuda().eval().to(torch.bfloat16).to(memory_format=torch.channels_last)
    cases["resnet50 bf16 batch 1"] = (resnet, torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.bfloat16))
    with torch.no_grad():
        for name, (m, x) in cases.items():
            ours, theirs = torch.compile(m, backend="smelt"), torch.compile(m, backend="inductor")
            for _ in range(3):
                ours(x)
                theirs(x)
            fast = cuda_binary.fast_launch()
            if fast is None:
                print("no C launcher here: nothing to compare")
                return
            times = {"C": [], "ctypes": [], "inductor": []}
            for _ in range(3):
                for how in times:
                    cuda_binary._fast_launch = None if how == "ctypes" else fast
                    f = theirs if how == "inductor" else ours
                    times[how].append(triton.testing.do_bench(lambda: f(x), return_mode="median") * 1e3)
            cuda_binary._fast_launch = fast
            print(name, {k: [round(v, 1) for v in vs] for k, vs in times.items()}, "us per call")


if __name__ == "__main__":
    main()
