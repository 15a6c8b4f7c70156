"""Float32 CPU convolutions three ways (issue 23; runtime/packed_convolution.py): ATen's convolution of a
channels-last input with an NCHW weight, then ReLU (smelt's default path); oneDNN's weight reorder every
call + mkldnn._convolution_pointwise with its ReLU fused; the same with the weight packed once (the
SMELT_FREEZE_WEIGHTS case). ResNet-18's layer shapes at batch 4, median ms of 30 calls, three rounds.

    python -m benchmarks.probes.packed_convolution [--rounds 3]
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.measure import median_call_ms

# (input channels, output channels, input size, window, stride)
SHAPES = [(64, 64, 56, 3, 1), (128, 128, 28, 3, 1), (256, 256, 14, 3, 1), (512, 512, 7, 3, 1), (3, 64, 224, 7, 2)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms: ATen / packed each call / packed once")
    torch.manual_seed(0)
    for c_in, c_out, size, k, stride in SHAPES:
        x = torch.randn(4, c_in, size, size).to(memory_format=torch.channels_last)
        w, b, pad = torch.randn(c_out, c_in, k, k), torch.randn(c_out), [k // 2] * 2
        strides, dilation = [stride] * 2, [1, 1]

        def aten():
            return torch.relu(torch.convolution(x, w, b, strides, pad, dilation, False, [0, 0], 1))

        def pack():
            return torch.ops.mkldnn._reorder_convolution_weight(w, pad, strides, dilation, 1, list(x.shape))

        def fused(packed):
            return torch.ops.mkldnn._convolution_pointwise(x, packed, b, pad, strides, dilation, 1, "relu", [], None)
        packed = pack()
        torch.testing.assert_close(fused(packed), aten())
        rounds = [(median_call_ms(aten, (), 30), median_call_ms(lambda: fused(pack()), (), 30),
                   median_call_ms(lambda: fused(packed), (), 30))
                  for _ in range(args.rounds)]
        print(f"{c_in} -> {c_out} at {size}, {k}x{k} / {stride}: " + " | ".join("%.2f / %.2f / %.2f" % r for r in rounds),
              flush=True)


if __name__ == "__main__":
    main()
