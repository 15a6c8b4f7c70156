"""A Halide kernel timed alone and right after a oneDNN convolution wrote its input (issue 23): the
two thread pools, Halide's and torch's OpenMP one, shared the CPU's cores (runtime/halide_threads.py).

    python -m benchmarks.probes.halide_after_convolution   # then SMELT_HALIDE_OPENMP=0, alternating

The kernel is MobileNetV3-small's after its stem: batch norm + hardswish over 4x16x112x112, NHWC.
"""
from __future__ import annotations

import timeit

import torch
import torch.nn.functional as F

import smelt  # noqa: F401  (registers the backend)


def main() -> None:
    torch.manual_seed(0)
    mean, var, weight, bias = torch.randn(16), torch.rand(16) + 0.5, torch.randn(16), torch.randn(16)
    kernel = torch.compile(lambda y: F.hardswish(F.batch_norm(y, mean, var, weight, bias, False)), backend="smelt")
    conv = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
    image = torch.randn(4, 3, 224, 224).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        y = conv(image)
        kernel(y)

        def best_us(fn, n=50):
            return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

        alone = best_us(lambda: kernel(y))
        convolution = best_us(lambda: conv(image))
        both = best_us(lambda: kernel(conv(image)))
    print(f"kernel alone {alone:.1f} us; convolution {convolution:.1f} us; convolution then kernel {both:.1f} us "
          f"-> the kernel after a convolution {both - convolution:.1f} us")


if __name__ == "__main__":
    main()
