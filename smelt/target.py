"""What a backend tells the compiler about the machine its kernels run on: the inputs of the
decisions made before code generation that depend on it (each backend's `target(device_type)`,
codegen/backends.py). The lowering reads it through `IRGraph.target_for`."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    """One backend on one device type. The split-reduction numbers are read by
    lowering/split_reduction.py, which documents the reduction strategy they are part of."""

    name: str  # for messages: the machine the numbers were measured on
    # Tensors whose storage holds more elements run in ATen (Halide describes buffers by int32 extents).
    max_storage_elements: int | None
    # Programs the first kernel of a split column reduction aims for (its partials are that many
    # per block of outputs, so also the second kernel's row length).
    split_programs: int
    # Programs a split row reduction aims for: many short chunks, each read in one go.
    row_split_programs: int
    # A reduction to one value splits from this many elements (below SMELT_SPLIT_REDUCTION_MIN_NUMEL).
    global_split_min_numel: int
    # Whether a pointwise kernel is walked as rows where a value then depends on the row alone (a
    # channel's scale over an NCHW tensor): its compiler computes it once per row, not per element.
    # A CPU's per-element arithmetic costs time; so does a GPU's where an element takes an exp and
    # an IEEE division (a BN + SiLU over 32 channels-last channels, bf16: 32.2 -> 28.5 us on the
    # H200; BN + ReLU over 64: 39.2 -> 30.1; RESULTS, twenty-fifth session).
    rows_for_row_values: bool = False
    # Where set, those rows only where whole tiles of at most this width (the Triton tile's side,
    # codegen/triton/tiles.py) cover them: on the GPU a 96-long row took a 64-wide tile and a
    # half-masked one, each reading 128 of its 192 bytes (EfficientNet's 96-channel BN + SiLU
    # 85 -> 118-144 us; benchmarks/probes/row_value_tiles.py).
    row_value_tile_width: int | None = None
    # Whether 2-D convolutions get channels-last operands and the values between them are laid out
    # so (lowering/layout_plan.py): cuDNN's tensor-core convolutions convert NCHW both ways otherwise.
    channels_last_convolutions: bool = False
    # Whether a convolution's bias is added by the kernel after it (lowering/extern_calls.py): cuDNN
    # adds it in a pass of its own; oneDNN inside the convolution, but see CPU below.
    adds_convolution_bias: bool = False
    # Whether large matrix products get 16-byte aligned rows (lowering/matmul_padding.py): cuBLAS's
    # tensor-core kernels need them, and run element by element otherwise.
    pads_matmul_rows: bool = False
    # The largest 2-D window (in elements) of a depthwise convolution run as a smelt kernel
    # (lowering/depthwise_convolution.py) rather than in the library; 0: none. On the H200, smelt's
    # 3x3 and 5x5 kernels cost 2% (EfficientNet-B0) and 8% (MobileNetV3) more GPU time than cuDNN's
    # but take its host time and its plan built at each shape's first call (0.47 s a shape, per
    # thread): walls 1.12x and 1.18x, warm starts 2 s shorter (RESULTS 2026-12-01, thirty-fifth
    # session). 7x7 windows stay with cuDNN (ConvNeXt 2.47 -> 3.82 GPU ms, seventh session).
    depthwise_kernel_taps: int = 0
    # The same for a depthwise convolution's backward (lowering/depthwise_convolution_backward.py).
    depthwise_backward_kernel_taps: int = 0
    # How such a backward computes the weight's gradient: "reduction" (smelt's IR, any backend),
    # "kernel" (runtime/depthwise_weight_gradient.py, channels-last tensors) or "library". On the
    # H200 (AMP training, GPU ms a step, RESULTS 2026-12-02, forty-first session), EfficientNet-B0 /
    # MobileNetV3: cuDNN's whole backward 6.473 / 4.420, smelt's input gradient with cuDNN's weight
    # gradient 6.496 / 4.419, with the kernel 6.942 / 4.905 (its weight gradients 1.8x cuDNN's), with
    # the reduction 7.109 / 4.937. The input gradient fuses into smelt's kernels, so cuDNN's calls
    # halve: walls 1.15x / 1.12x (best turns; medians within the host's swings), and the plans
    # cuDNN builds at each shape's first call 6.1 -> 4.6 s for EfficientNet's 12 shapes.
    depthwise_weight_gradient: str = "reduction"
    # Whether a 1x1 convolution (stride 1, no padding, one group) over a channels-last activation
    # runs as the matrix product it is (lowering/convolution_calls.py): on the H100 host, cuDNN's
    # convolution call costs 22-33 us (EfficientNet-B0's 81 a call: 2.0-2.6 ms of host, the GPU's
    # 1.5 ms of work), cuBLAS's product about 8. On the H200, bf16 inference: GPU time even
    # (EfficientNet-B0 1.471 -> 1.454 ms, MobileNetV3 0.831 -> 0.815, ResNet-50 1.497 -> 1.507;
    # RESULTS 2026-11-30, twenty-sixth session), walls in interleaved turns EfficientNet-B0
    # 2.394 -> 2.174 ms, ResNet-50 1.866 -> 1.896 (twenty-ninth session).
    pointwise_convolutions_as_products: bool = False
    # Whether a convolution weight that is a graph input (a parameter) is copied to channels-last by
    # smelt's kernel, as other operands are, rather than left to the library call, which converts
    # it inside: on the GPU each copy would be a launch from the wrapper (53 a ResNet-50 call). On
    # the 2-core CPU ATen's copy of a [512, 512, 3, 3] weight took 877 us, smelt's kernel 483
    # (ResNet-18 makes 18 such copies a call, 5.5 ms of about 95).
    copies_convolution_weights: bool = False
    # Whether float32 CPU convolutions run through oneDNN with their weight packed in its blocked
    # layout (runtime/packed_convolution.py) rather than ATen's convolution, which converts the weight
    # twice a call.
    packed_convolutions: bool = False
    # Whether inference attention written by hand over fewer than 64 keys runs as one Triton kernel
    # (runtime/short_attention.py) rather than as its products and softmax; and a training graph's,
    # with the kernel's backward (on the H200, Swin-T's AMP training step: 10.04 -> 7.94 GPU ms).
    short_attention_kernel: bool = False
    short_attention_training: bool = False
    # Whether a zero-dimensional float CPU input (an epsilon or scale Dynamo passes as a tensor
    # when it does not specialize a Python float) is read on the host and handed to the kernels
    # reading it as a float64 argument, rather than read from memory: in a GPU graph that memory is
    # on the wrong device, and each op reading it ran in ATen (Qwen2's dynamic row: 18 such
    # inputs, 19 ATen calls a call, each norm split around its epsilon).
    host_scalar_args: bool = False
    # Whether a float32 addmm runs as mm, its bias added by the kernel after it (lowering/extern_calls.py):
    # ATen's float32 addmm goes through cuBLASLt's bias epilogue, which on the H200 ran
    # cutlass_80_simt_sgemm_256x128_8x4_nn_align1 for 36 of GPT-2's 49 fp32 products (dynamic row); as mm,
    # 24 of them got the xmma kernels Inductor's mm + add gets and the other 12 (q/k/v, which keep addmm
    # now) the same SIMT kernel: cuBLAS 24.76 -> 24.41 ms a call (RESULTS, thirty-second session).
    float32_product_bias_in_kernel: bool = False
    # Whether a float32 product over a Linear's weight runs through oneDNN's linear where timing both
    # libraries on the shape found it faster than ATen's (runtime/onednn_linear.py).
    onednn_products: bool = False
    # The most multiply-adds of a 1x1 convolution run as a reduction in smelt's kernels rather than
    # a library call (lowering/small_products.py); 0: none. On the GPU a squeeze-excite product's
    # arithmetic (EfficientNet-B0's largest: 32 x 1152 x 48, 1.8M) is a microsecond's, the library
    # call's host time several; the limit leaves every 1x1 convolution over a whole image at batch 32
    # (EfficientNet's smallest: 32 x 14 x 14 x 80 x 480, 241M) to cuBLAS.
    small_product_macs: int = 0


def switched_on(setting: str, target: Target, field: str) -> bool:
    """An auto / on / off setting on a device: "auto" is the Target's `field`."""
    return getattr(target, field) if setting == "auto" else setting == "on"

# An H100 (132 SMs): about 8 programs per SM keep loads in flight on every SM while the partials
# stay few. A global sum of 2**26 float32 ran at 93% of copy bandwidth with 16384 chunks of 4096
# whose last program adds the partials, against 86-88% with 1024 longer chunks looped over
# (benchmarks/probes/reduction_variants.py). One value splits from 4096 elements: its second
# stage runs in the first kernel's last program, so the split costs no launch.
H100 = Target("H100", None, split_programs=1024, row_split_programs=16384, global_split_min_numel=4096,
              channels_last_convolutions=True, adds_convolution_bias=True, pads_matmul_rows=True,
              rows_for_row_values=True, row_value_tile_width=64, short_attention_kernel=True,
              short_attention_training=True, pointwise_convolutions_as_products=True, host_scalar_args=True,
              float32_product_bias_in_kernel=True, depthwise_kernel_taps=25, depthwise_backward_kernel_taps=25,
              depthwise_weight_gradient="library", small_product_macs=1 << 22)
# A CPU's thread pool (Halide): a few hundred chunks keep 16 threads busy and each chunk long
# enough to stream. On the H100 machine's 16-core CPU (benchmarks.split_reductions --device cpu,
# RESULTS 2026-11-27) H100's numbers against these: a global sum of 32M float32 1749 -> 769 us,
# var_mean 7354 -> 1101 us, argmax 7449 -> 2438 us; column sums within 12% either way.
CPU = Target("CPU", None, split_programs=256, row_split_programs=256, global_split_min_numel=4096,
             rows_for_row_values=True, channels_last_convolutions=True, adds_convolution_bias=True,
             copies_convolution_weights=True, onednn_products=True)
# The bias too: torch 2.13's oneDNN convolution crashes (signal 11) on some channels-last inputs
# given a bias, and not without one (CPU fuzz seed 1941: a [1, 6, 2, 1] input, groups 2, stride 2,
# padding 1, dilation 2; eager crashes the same way). The add fuses into the kernel after it.
# Channels-last on the CPU too: oneDNN's convolutions run faster on NHWC (MobileNetV3-small's
# 18.4 -> 10.5 ms a call on 2 cores) and the NHWC kernels between them walk rows of C; the whole
# model 35-40 -> 26-27 ms, ResNet-18 within noise (benchmarks.cpu_models, RESULTS 2026-11-27).
