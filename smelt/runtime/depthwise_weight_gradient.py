"""smelt::depthwise_weight_gradient: the weight's gradient of a 2-D depthwise convolution over
channels-last tensors, as two Triton kernels (depthwise_weight_gradient_kernel.py).

Written as a reduction per (tap, channel) in smelt's IR, each tap's sum read the gradient again:
94-149 us a layer of EfficientNet-B0's AMP training step on the H200 against cuDNN's ~25 (RESULTS,
fortieth session). Here the gradient and the input are read about once, all taps summed together.
lowering/depthwise_convolution_backward.py calls it under SMELT_DEPTHWISE_WEIGHT_GRADIENT=kernel for
CUDA tensors of float32 or half floats (on the CPU, under the Triton backend, through Triton's
interpreter). Best of a sweep, it takes 1.8x cuDNN's GPU time on EfficientNet-B0's and MobileNetV3's
layers (H200, RESULTS forty-first session): cuDNN's weight gradient stays the GPU's default.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton

PARTIAL_RUNS_PER_SM = 8  # runs of output rows a multiprocessor takes, over all channel blocks


@dataclasses.dataclass(frozen=True)
class Blocks:
    channels: int  # BC: channels a program takes (contiguous in channels-last memory)
    outputs: int  # BW: outputs of a row loaded together
    warps: int
    runs: int  # runs of output rows the sum is split into (partial sums each)


def choose_blocks(channels: int, out_width: int, rows: int, taps: int, sms: int) -> Blocks:
    """Blocks for a layer: a [TAPS, BW, BC] tile of 8192 input elements, and enough runs of rows
    that every multiprocessor has PARTIAL_RUNS_PER_SM programs (the best of a sweep on most of
    EfficientNet-B0's and MobileNetV3's layers, benchmarks/probes/depthwise_weight_gradient.py)."""
    bc = min(32, max(16, triton.next_power_of_2(channels)))
    bw = max(1, min(triton.next_power_of_2(out_width), 8192 // (triton.next_power_of_2(taps) * bc)))
    channel_blocks = triton.cdiv(channels, bc)
    runs = max(1, min(rows, triton.cdiv(PARTIAL_RUNS_PER_SM * sms, channel_blocks)))
    return Blocks(bc, bw, 4, runs)


@torch.library.custom_op("smelt::depthwise_weight_gradient", mutates_args=())
def depthwise_weight_gradient(grad: torch.Tensor, x: torch.Tensor, kernel_size: list[int], stride: list[int],
                              padding: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The [C, 1, KH, KW] weight gradient (in `dtype`) of a depthwise convolution of x [N, C, H, W]
    whose output's gradient is grad [N, C, OH, OW], no dilation, float32 sums rounded once (a float64
    convolution's gradient would lose its precision: the lowering keeps those from it)."""
    return run(grad, x, kernel_size, stride, padding, dtype)


@depthwise_weight_gradient.register_fake
def _(grad, x, kernel_size, stride, padding, dtype):
    return grad.new_empty((grad.shape[1], 1, *kernel_size), dtype=dtype)


def run(grad, x, kernel_size, stride, padding, dtype, blocks: Blocks | None = None) -> torch.Tensor:
    n, c, h, w = x.shape
    oh, ow = grad.shape[2:]
    kh, kw = kernel_size
    out = torch.empty((c, 1, kh, kw), dtype=dtype, device=x.device)
    rows = n * oh
    if rows == 0 or ow == 0:
        return out.zero_()
    grad, x = (t if t.stride(1) == 1 else t.contiguous(memory_format=torch.channels_last) for t in (grad, x))
    if blocks is None:
        blocks = choose_blocks(c, ow, rows, kh * kw, _multiprocessors(x.device))
    rows_per_run = triton.cdiv(rows, blocks.runs)
    runs = triton.cdiv(rows, rows_per_run)
    strides = [*(grad.stride(i) for i in (0, 2, 3)), *(x.stride(i) for i in (0, 2, 3))]
    vec = vector_width(c, strides)
    partials = torch.empty((runs, kh * kw, c), dtype=torch.float32, device=x.device)
    kernels = _kernels(x.device)
    kernels.depthwise_weight_gradient_partials[(triton.cdiv(c, blocks.channels), runs)](
        grad, x, partials, c // vec, h, w, oh, ow, rows, rows_per_run, *(s // vec for s in strides),
        KH=kh, KW=kw, SH=stride[0], SW=stride[1], PH=padding[0], PW=padding[1],
        TAPS=triton.next_power_of_2(kh * kw), BW=blocks.outputs, BC=blocks.channels, VEC=vec,
        num_warps=blocks.warps)
    finish_block = 32
    kernels.depthwise_weight_gradient_finish[(triton.cdiv(kh * kw * c, finish_block),)](
        partials, out, c, runs, TAP_COUNT=kh * kw, RB=64, BLOCK=finish_block, num_warps=4)
    return out


def vector_width(channels: int, strides) -> int:
    """The kernel's VEC: the largest power of two up to 8 dividing the channel count and every
    stride (the kernel takes them divided by it, so the compiler knows their alignment)."""
    vec = 8
    while any(s % vec for s in (channels, *strides)):
        vec //= 2
    return vec


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's interpreter on the CPU: a few runs, to test the split
    return torch.cuda.get_device_properties(device).multi_processor_count


def _kernels(device: torch.device):
    """The kernels' module: compiled for the GPU, or run by Triton's interpreter for CPU tensors."""
    from . import depthwise_weight_gradient_kernel
    if device.type == "cuda":
        return depthwise_weight_gradient_kernel
    from .loader import load_module
    return load_module(depthwise_weight_gradient_kernel.__file__, interpret=True)
