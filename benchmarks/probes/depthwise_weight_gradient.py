"""smelt's depthwise weight gradient (smelt/runtime/depthwise_weight_gradient.py) against cuDNN's, layer
by layer over a model's depthwise convolutions (bf16, channels-last, the AMP training step's shapes):
GPU time queued behind a sleep with L2 flushed before each call, the chosen blocks and the best of a sweep,
and the values checked against a float64 reference.

    python -m benchmarks.probes.depthwise_weight_gradient efficientnet mobilenetv3 [--batch 32] [--sweep]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import triton

from smelt.runtime.depthwise_weight_gradient import Blocks, choose_blocks, run
from smelt.tools.model_suite.zoo import all_specs


def depthwise_layers(model_name: str) -> list[tuple]:
    """(channels, H, W, kernel, stride, padding) of each distinct depthwise convolution at 224x224."""
    model = all_specs()[model_name].build("real").eval()
    found = []

    def hook(module, inputs, output):
        x = inputs[0]
        key = (module.in_channels, x.shape[2], x.shape[3], module.kernel_size[0], module.stride[0], module.padding[0])
        if key not in found:
            found.append(key)
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d) and m.groups == m.in_channels > 1 and m.out_channels == m.in_channels:
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(1, 3, 224, 224))
    return found


def gpu_us(fn, flush: torch.Tensor, calls: int = 15) -> float:
    """Median over calls of fn's GPU time, L2 flushed before each (as in a model, where a layer's
    gradient and input were written long before): the calls are queued behind a sleeping kernel,
    so the host's launch time is not in the events' span."""
    from smelt.runtime.autotune import _cycles_per_ms
    fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda._sleep(int(_cycles_per_ms() * 20))  # 20 ms: longer than queueing the calls takes
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(1000 * start.elapsed_time(end) for start, end in events)
    return times[calls // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model_name in args.models:
        totals = [0.0, 0.0, 0.0]
        print(f"\n{model_name}, batch {args.batch}, bf16 channels-last: (C, H, W, k, stride, pad) "
              f"cuDNN us / smelt us (chosen blocks) / best of sweep us (blocks); max error against float64 "
              f"(cuDNN's, smelt's)")
        for c, h, w, k, s, p in depthwise_layers(model_name):
            x = torch.randn(args.batch, c, h, w, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
            weight = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16)
            out = torch.nn.functional.conv2d(x, weight, stride=s, padding=p, groups=c)
            grad = torch.randn_like(out).contiguous(memory_format=torch.channels_last)

            def cudnn():
                return torch.ops.aten.convolution_backward(grad, x, weight, None, [s, s], [p, p], [1, 1], False,
                                                           [0, 0], c, [False, True, False])[1]
            ref = torch.ops.aten.convolution_backward(grad.double(), x.double(), weight.double(), None, [s, s], [p, p],
                                                      [1, 1], False, [0, 0], c, [False, True, False])[1]
            chosen = choose_blocks(c, out.shape[3], args.batch * out.shape[2], k * k, sms)
            mine = run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16)
            scale = ref.abs().max().item()
            errors = ((cudnn().double() - ref).abs().max().item() / scale, (mine.double() - ref).abs().max().item() / scale)
            cudnn_us = gpu_us(cudnn, flush)
            mine_us = gpu_us(lambda: run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16), flush)
            best = (mine_us, chosen)
            if args.sweep:
                taps = triton.next_power_of_2(k * k)
                for bc, bw, warps, runs_scale in itertools.product((16, 32, 64), (4, 8, 16, 32), (4, 8), (1, 2)):
                    if taps * bw * bc > 8192 or bc > max(16, triton.next_power_of_2(c)) or (bc == 16 and c >= 32):
                        continue
                    blocks = Blocks(bc, bw, warps, max(1, int(chosen.runs * runs_scale)))
                    us = gpu_us(lambda: run(grad, x, [k, k], [s, s], [p, p], torch.bfloat16, blocks), flush, calls=7)
                    if us < best[0]:
                        best = (us, blocks)
            totals[0] += cudnn_us
            totals[1] += mine_us
            totals[2] += best[0]
            b = best[1]
            print(f"  ({c}, {h}, {w}, {k}, {s}, {p})  {cudnn_us:7.1f} / {mine_us:7.1f} ({chosen.channels}x{chosen.outputs}, "
                  f"{chosen.warps}w, {chosen.runs} runs) / {best[0]:7.1f} ({b.channels}x{b.outputs}, {b.warps}w, "
                  f"{b.runs} runs)   errors {errors[0]:.1e} {errors[1]:.1e}")
        print(f"  total: cuDNN {totals[0]:.1f} us, smelt {totals[1]:.1f} us, best of sweep {totals[2]:.1f} us")


if __name__ == "__main__":
    main()
