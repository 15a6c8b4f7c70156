"""Single kernels of the shapes CPU models run, smelt against Inductor's C++ backend (issue 23): each
case compiled by both in one process, calls interleaved, median us a call (Dynamo's guards included,
the same for both), smelt's result checked against eager's first.

    python -m benchmarks.probes.cpu_row_kernels [--calls 200] [--threads 1] [--case LayerNorm]

Cases: column sums, channels-last batch-norm statistics and training batch norm, a squeeze-excite
block's hard-swish and mean over NHWC (MobileNetV3's), a residual add and RMSNorm (two outputs), a
residual add and LayerNorm in a training forward (inputs requiring grad: the forward graph is timed,
whose kernel also stores a value per row for the backward), a convolution weight's channels-last
copy (with eager's, ATen's copy, in a third column), layout copies at a conv net's edges, Llama's
SiLU-multiply.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import smelt  # noqa: F401 - registers the backend


def _hardswish_mean(x):
    y = x * 1.1 + 0.3
    y = y * (y + 3).clamp(0, 6) / 6
    return y, y.mean((2, 3), keepdim=True)


def _residual_rms_norm(x, r, w):
    h = x + r
    return h, w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def _residual_layer_norm(x, y, w, b):
    return torch.nn.functional.layer_norm(x + y, (x.shape[-1],), w, b)


def cases():
    cl = torch.channels_last
    return [
        ("column sum 4096 x 1024", lambda x: x.sum(0), (torch.randn(4096, 1024),)),
        ("column sum 512 x 120", lambda x: x.sum(0), (torch.randn(512, 120),)),
        ("var_mean NHWC [32, 64, 56, 56]", lambda x: torch.var_mean(x, (0, 2, 3), correction=0),
         (torch.randn(32, 64, 56, 56).to(memory_format=cl),)),
        ("batch norm training NHWC [8, 120, 28, 28]",
         lambda x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, training=True),
         (torch.randn(8, 120, 28, 28).to(memory_format=cl), torch.randn(120), torch.randn(120))),
        ("hard-swish + mean NHWC [4, 120, 14, 14]", _hardswish_mean, (torch.randn(4, 120, 14, 14).to(memory_format=cl),)),
        ("hard-swish + mean NHWC [4, 240, 14, 14]", _hardswish_mean, (torch.randn(4, 240, 14, 14).to(memory_format=cl),)),
        ("hard-swish + mean NHWC [4, 576, 7, 7]", _hardswish_mean, (torch.randn(4, 576, 7, 7).to(memory_format=cl),)),
        ("residual add + RMSNorm [4, 128, 256]", _residual_rms_norm,
         (torch.randn(4, 128, 256), torch.randn(4, 128, 256), torch.randn(256))),
        # A training forward: the kernel also stores a value per row for the backward.
        ("residual add + LayerNorm training forward [512, 768]", _residual_layer_norm,
         tuple(torch.randn(*shape, requires_grad=True) for shape in ((512, 768), (512, 768), (768,), (768,)))),
        # The CPU model suite's BERT (hidden 256, 4 x 128 tokens), inference.
        ("residual add + LayerNorm [512, 256]", _residual_layer_norm,
         tuple(torch.randn(*shape) for shape in ((512, 256), (512, 256), (256,), (256,)))),
        # A convolution weight's channels-last copy (ResNet-18's layer 4), against ATen's own below.
        ("weight to channels-last [512, 512, 3, 3]", _channels_last, (torch.randn(512, 512, 3, 3),)),
        ("weight to channels-last [256, 256, 3, 3]", _channels_last, (torch.randn(256, 256, 3, 3),)),
        # A conv net's input at the graph's edge, and feature maps copied back to NCHW.
        ("input to channels-last [4, 3, 224, 224]", _channels_last, (torch.randn(4, 3, 224, 224),)),
        ("channels-last to NCHW [4, 64, 56, 56]", _nchw, (torch.randn(4, 64, 56, 56).to(memory_format=cl),)),
        ("channels-last to NCHW [4, 256, 14, 14]", _nchw, (torch.randn(4, 256, 14, 14).to(memory_format=cl),)),
        # Llama's MLP activation (4 x 128 tokens, 688 wide).
        ("silu(a) * b [512, 688]", lambda a, b: torch.nn.functional.silu(a) * b,
         (torch.randn(512, 688), torch.randn(512, 688))),
        # exp_float32's other callers at the same size: exp itself, sigmoid and softmax (its nonpositive path).
        ("exp(a) * b [512, 688]", lambda a, b: torch.exp(a) * b, (torch.randn(512, 688), torch.randn(512, 688))),
        ("sigmoid(a) * b [512, 688]", lambda a, b: torch.sigmoid(a) * b, (torch.randn(512, 688), torch.randn(512, 688))),
        ("softmax [512, 688]", lambda a: torch.softmax(a, -1), (torch.randn(512, 688) * 3,)),
    ]


def _nchw(x):
    return (x + 1).contiguous()


def _channels_last(w):
    return w.contiguous(memory_format=torch.channels_last)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, help="torch's threads (smelt's Halide kernels run on them too)")
    parser.add_argument("--case", default="", help="only the cases whose name contains this")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| case | Inductor us | smelt us | eager us |\n| --- | --- | --- | --- |")
    for name, fn, inputs in cases():
        if args.case not in name:
            continue
        torch._dynamo.reset()
        compiled = {"inductor": torch.compile(fn), "smelt": torch.compile(fn, backend="smelt"), "eager": fn}
        for f in compiled.values():
            for _ in range(5):
                f(*inputs)
        torch.testing.assert_close(compiled["smelt"](*inputs), fn(*inputs), rtol=1e-4, atol=1e-4)
        times = {k: [] for k in compiled}
        for _ in range(args.calls):
            for k, f in compiled.items():
                start = time.perf_counter()
                f(*inputs)
                times[k].append(time.perf_counter() - start)
        print(f"| {name} | " + " | ".join(f"{statistics.median(times[k]) * 1e6:.1f}" for k in compiled) + " |", flush=True)


if __name__ == "__main__":
    main()
