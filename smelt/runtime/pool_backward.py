"""smelt::max_pool_backward and smelt::avg_pool_backward: pools' backwards without their inputs
(decompositions.py puts them in place of ATen's).

ATen's max_pool{2,3}d_with_indices_backward and avg_pool{2,3}d_backward take the pool's input but
read only its shape and layout: the gradient goes where the indices say, or spreads over the
window. Given the input, AOTAutograd's min-cut partitioner counts it as a value that an op it
cannot fuse needs in the backward, so it saves it: ResNet-50's stem ReLU beside the convolution
output it is recomputed from (Inductor saves only the latter), or a convolution's output that
feeds only an average pool. These ops take the input's shape instead and lay their result out as
the gradient is (a pool's output follows its input's layout, channels-last or not). smelt lowers
them (lowering/pooling.py); where that falls back, ATen's op runs on an uninitialized input of
that shape and layout.
"""
from __future__ import annotations

from typing import Optional

import torch

aten = torch.ops.aten


def _input_like(grad: torch.Tensor, input_size: list[int]) -> torch.Tensor:
    """An uninitialized tensor of the input's shape, laid out as `grad` is."""
    layout = torch.contiguous_format
    for channels_last, rank in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if grad.dim() == rank and grad.is_contiguous(memory_format=channels_last) and not grad.is_contiguous():
            layout = channels_last
    return torch.empty(input_size, dtype=grad.dtype, device=grad.device, memory_format=layout)


@torch.library.custom_op("smelt::max_pool_backward", mutates_args=())
def max_pool_backward(grad: torch.Tensor, indices: torch.Tensor, input_size: list[int], kernel_size: list[int],
                      stride: list[int], padding: list[int], dilation: list[int], ceil_mode: bool,
                      spatial_dims: int) -> torch.Tensor:
    """ATen's max_pool{spatial_dims}d_with_indices_backward for an input of `input_size`."""
    op = aten.max_pool2d_with_indices_backward if spatial_dims == 2 else aten.max_pool3d_with_indices_backward
    return op(grad, _input_like(grad, input_size), kernel_size, stride, padding, dilation, ceil_mode, indices)


@max_pool_backward.register_fake
def _(grad, indices, input_size, kernel_size, stride, padding, dilation, ceil_mode, spatial_dims):
    return _input_like(grad, input_size)


@torch.library.custom_op("smelt::avg_pool_backward", mutates_args=())
def avg_pool_backward(grad: torch.Tensor, input_size: list[int], kernel_size: list[int], stride: list[int],
                      padding: list[int], ceil_mode: bool, count_include_pad: bool, divisor_override: Optional[int],
                      spatial_dims: int) -> torch.Tensor:
    """ATen's avg_pool{spatial_dims}d_backward for an input of `input_size`."""
    op = aten.avg_pool2d_backward if spatial_dims == 2 else aten.avg_pool3d_backward
    return op(grad, _input_like(grad, input_size), kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override)


@avg_pool_backward.register_fake
def _(grad, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, spatial_dims):
    return _input_like(grad, input_size)
