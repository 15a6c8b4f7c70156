"""Tensors made from nothing: full, zeros, ones, empty, arange, scalar_tensor, *_like, fill."""
from __future__ import annotations

import torch

from ..ir import Pointwise, TensorBox, ops
from .common import in_dtype, out_size, scalar_value
from .registry import lowering

aten = torch.ops.aten


def _filled(g, value) -> TensorBox:
    meta = g.out_meta
    dtype = meta.dtype
    value = in_dtype(value, dtype)  # the tensor holds the value in its dtype, for a fused consumer too
    return TensorBox.of_storage(Pointwise(meta.device, dtype, lambda index: scalar_value(value, dtype),
                                          out_size(g), g.origin))


@lowering(aten.full, aten.new_full)
def full(g, *args, **kwargs):
    value = args[-1] if g.node.target.overloadpacket is aten.full else args[2]
    return _filled(g, value)


@lowering(aten.full_like, aten.fill)
def full_like(g, x, value, **kwargs):
    return _filled(g, value)


@lowering(aten.zeros, aten.new_zeros, aten.zeros_like, aten.empty, aten.new_empty, aten.empty_like,
          aten.empty_strided, aten.empty_permuted)
def zeros(g, *args, **kwargs):
    # `empty` may hold anything; zeros are the cheapest deterministic "anything".
    return _filled(g, 0)


@lowering(aten.ones, aten.new_ones, aten.ones_like)
def ones(g, *args, **kwargs):
    return _filled(g, 1)


@lowering(aten.scalar_tensor)
def scalar_tensor(g, value, **kwargs):
    return _filled(g, value)


@lowering(aten.arange)
def arange(g, *args, **kwargs):
    numeric = [a for a in args if not isinstance(a, (torch.dtype, torch.device, torch.layout))]
    start, step = 0, 1
    if g.node.target in (aten.arange.start, aten.arange.start_step, aten.arange.start_out):
        start = numeric[0]
        step = numeric[2] if len(numeric) > 2 else 1
    step = kwargs.get("step", step)
    meta = g.out_meta
    dtype = meta.dtype

    def inner_fn(index):
        position = ops.index_expr(index[0], torch.int64)
        if dtype.is_floating_point:
            return ops.add(scalar_value(start, dtype), ops.mul(ops.to_dtype(position, dtype), scalar_value(step, dtype)))
        return ops.to_dtype(ops.add(scalar_value(start, torch.int64),
                                    ops.mul(position, scalar_value(step, torch.int64))), dtype)
    return TensorBox.of_storage(Pointwise(meta.device, dtype, inner_fn, out_size(g), g.origin))
