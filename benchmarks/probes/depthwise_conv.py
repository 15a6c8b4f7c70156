"""Depthwise convolutions alone on the GPU (issue 22): smelt's kernel (lowering/depthwise_convolution.py)
against eager's cuDNN call and Inductor's, at the shapes of ConvNeXt-tiny, EfficientNet-B0 and
MobileNetV3-large (bf16, batch 32, channels-last), with the bytes-moved floor: reading the input and
writing the output once, at the measured copy bandwidth.

    python -m benchmarks.probes.depthwise_conv [--batch 32] [--fused]

--fused adds batch norm and hard-swish after each convolution (a mobile net's block): smelt fuses them.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton.testing

import smelt  # noqa: F401
import smelt.config

# (model, channels, spatial size, kernel, stride)
SHAPES = (
    ("convnext s1", 96, 56, 7, 1), ("convnext s2", 192, 28, 7, 1), ("convnext s3", 384, 14, 7, 1),
    ("convnext s4", 768, 7, 7, 1),
    ("efficientnet", 96, 112, 3, 2), ("efficientnet", 144, 56, 5, 1), ("efficientnet", 240, 28, 3, 1),
    ("efficientnet", 672, 14, 5, 1),
    ("mobilenetv3", 64, 112, 3, 2), ("mobilenetv3", 120, 28, 5, 1), ("mobilenetv3", 480, 14, 3, 1),
    ("mobilenetv3", 960, 7, 5, 1),
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--fused", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e3  # noqa: E731
    big = torch.empty(2**28, device="cuda", dtype=torch.bfloat16)
    copy_gbs = 2 * big.numel() * 2 / bench(lambda: big.clone()) / 1e3
    del big
    print(f"copy bandwidth {copy_gbs:.0f} GB/s")
    print("| shape | eager (cuDNN) us | Inductor us | smelt us | smelt / Inductor | floor us | smelt's share of floor | max error smelt / eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, c, size, k, stride in SHAPES:
        x = torch.randn(args.batch, c, size, size, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16) * 0.1
        b = torch.randn(c, device="cuda", dtype=torch.bfloat16)
        scale = torch.rand(c, device="cuda", dtype=torch.bfloat16) + 0.5

        def fn(x, w, b, scale):
            y = F.conv2d(x, w, b, stride=stride, padding=k // 2, groups=c)
            return F.hardswish(y * scale[:, None, None]) if args.fused else y
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        with smelt.config.override(depthwise_kernels="on"):
            compiled = torch.compile(fn, backend="smelt")
            out = compiled(x, w, b, scale)
        exact = fn(x.double(), w.double(), b.double(), scale.double())
        eager_out = fn(x, w, b, scale)
        times = [bench(lambda f=f: f(x, w, b, scale)) for f in (fn, inductor, compiled)]
        floor = (x.numel() + out.numel()) * 2 / copy_gbs / 1e3
        errors = [(o.double() - exact).abs().max().item() for o in (out, eager_out)]
        print(f"| {name} {c}x{size}x{size} k{k} s{stride} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | "
              f"{times[1] / times[2]:.2f}x | {floor:.1f} | {floor / times[2]:.0%} | {errors[0]:.3g} / {errors[1]:.3g} |")


if __name__ == "__main__":
    main()
