"""smelt::depthwise_weight_gradient: the weight's gradient of a 2-D depthwise convolution over
channels-last tensors, as two Triton kernels (depthwise_weight_gradient_kernel.py).

Written as a reduction per (tap, channel) in smelt's IR, each tap's sum read the gradient again:
94-149 us a layer of EfficientNet-B0's AMP training step on the H200 against cuDNN's ~25 (RESULTS,
fortieth session). Here the gradient and the input are read about once, all taps summed together.
lowering/depthwise_convolution_backward.py calls it under SMELT_DEPTHWISE_WEIGHT_GRADIENT=kernel for
CUDA tensors of float32 or half floats (on the CPU, under the Triton backend, through Triton's
interpreter). Best of a sweep, it takes 1.5-1.7x cuDNN's GPU time on EfficientNet-B0's and MobileNetV3's
layers (H200, RESULTS forty-second session): cuDNN's weight gradient stays the GPU's default.
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
    """Blocks for a layer, the best of a sweep on EfficientNet-B0's and MobileNetV3's layers
    (benchmarks/probes/depthwise_weight_gradient.py --sweep, H200, RESULTS forty-second session):
    64 channels a program unless padding 64 wastes more than an eighth of them (72 and 144 channels
    take 32); a [TAPS, BW, BC] tile of 8192 input elements for windows up to 4x4, one output a strip
    for larger ones (a 5x5 window's 32 taps of 64 channels fill the registers already); and enough
    runs of rows that every multiprocessor has PARTIAL_RUNS_PER_SM programs."""
    bc = 64 if triton.cdiv(channels, 64) * 64 * 8 <= channels * 9 else 32
    bc = min(bc, max(16, triton.next_power_of_2(channels)))
    taps_p2 = triton.next_power_of_2(taps)
    bw = 1 if taps_p2 > 16 else max(1, min(triton.next_power_of_2(out_width), 8192 // (taps_p2 * bc)))
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
    n, c = x.shape[:2]
    kh, kw = kernel_size
    out = torch.empty((c, 1, kh, kw), dtype=dtype, device=x.device)
    if n * grad.shape[2] == 0 or grad.shape[3] == 0:
        return out.zero_()
    grad, x = (t if t.stride(1) == 1 else t.contiguous(memory_format=torch.channels_last) for t in (grad, x))
    # A call site's sizes and strides repeat from step to step: what they decide is worked out once.
    key = (grad.shape, grad.stride(), x.shape, x.stride(), tuple(kernel_size), tuple(stride), tuple(padding),
           x.device, blocks)
    launch = _launches.get(key)
    if launch is None:
        if len(_launches) >= MAX_LAUNCHES:
            _launches.clear()
        launch = _launches[key] = _plan(grad, x, kernel_size, stride, padding, blocks)
    partials = torch.empty((launch.runs, kh * kw, c), dtype=torch.float32, device=x.device)
    kernels = _kernels(x.device)
    kernels.depthwise_weight_gradient_partials[launch.grid](grad, x, partials, *launch.values, **launch.constexprs)
    kernels.depthwise_weight_gradient_finish[(triton.cdiv(kh * kw * c, FINISH_BLOCK),)](
        partials, out, c, launch.runs, TAP_COUNT=kh * kw, RB=64, BLOCK=FINISH_BLOCK, num_warps=4)
    return out


FINISH_BLOCK = 32  # partial sums of (tap, channel) a program of the finish kernel adds
MAX_LAUNCHES = 256  # call sites' geometries kept (sizes that change every call start over past it)


@dataclasses.dataclass(frozen=True)
class _Launch:
    grid: tuple
    runs: int
    values: tuple  # the partials kernel's arguments after its three tensors
    constexprs: dict


_launches: dict[tuple, _Launch] = {}


def _plan(grad, x, kernel_size, stride, padding, blocks: Blocks | None) -> _Launch:
    n, c, h, w = x.shape
    oh, ow = grad.shape[2:]
    kh, kw = kernel_size
    rows = n * oh
    if blocks is None:
        blocks = choose_blocks(c, ow, rows, kh * kw, _multiprocessors(x.device))
    rows_per_run = triton.cdiv(rows, blocks.runs)
    runs = triton.cdiv(rows, rows_per_run)
    strides = [*(grad.stride(i) for i in (0, 2, 3)), *(x.stride(i) for i in (0, 2, 3))]
    vec = vector_width(c, strides)
    values = (c // vec, h, w, oh, ow, rows, rows_per_run, *(s // vec for s in strides))
    constexprs = dict(KH=kh, KW=kw, SH=stride[0], SW=stride[1], PH=padding[0], PW=padding[1],
                      TAPS=triton.next_power_of_2(kh * kw), BW=blocks.outputs, BC=blocks.channels, VEC=vec,
                      num_warps=blocks.warps)
    return _Launch((triton.cdiv(c, blocks.channels), runs), runs, values, constexprs)


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
