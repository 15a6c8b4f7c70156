"""Padding modes that repeat the input's own elements: reflect and replicate.

Each output element reads one input element whose index along every padded dimension is a
function of the output index. That function needs abs or a clamp, which index expressions do
not have, so the index is computed as a value and read through an indirect index.
(Circular padding never gets here: aten._pad_circular is composite, traced into slices and copies.)
"""
from __future__ import annotations

import torch

from ..ir import Pointwise, TensorBox, ops
from ..symbolic import sympify
from .common import out_size
from .registry import lowering

aten = torch.ops.aten


def _reflect(i, before, size):
    """size-1 - |size-1 - |i - before||: walks back from each edge without repeating it."""
    last = ops.index_expr(sympify(size - 1), torch.int64)
    distance = ops.abs(ops.index_expr(sympify(i - before), torch.int64))
    return ops.indirect_indexing(ops.sub(last, ops.abs(ops.sub(last, distance))), size)


def _replicate(i, before, size):
    shifted = ops.index_expr(sympify(i - before), torch.int64)
    clamped = ops.minimum(ops.maximum(shifted, ops.constant(0, torch.int64)),
                          ops.index_expr(sympify(size - 1), torch.int64))
    return ops.indirect_indexing(clamped, size)


def _pad(g, x, padding, source):
    """Pad the last len(padding) // 2 dims of x; padding lists (before, after) from the last dim."""
    xsize = x.get_size()
    ndim = len(xsize)
    befores = {ndim - 1 - k: sympify(padding[2 * k]) for k in range(len(padding) // 2)}
    load = x.make_loader()

    def inner_fn(index):
        return load([source(i, befores[d], xsize[d]) if d in befores else i for d, i in enumerate(index)])
    return TensorBox.of_storage(Pointwise(x.get_device(), x.get_dtype(), inner_fn, out_size(g),
                                          g.origin | x.origins))


@lowering(aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d)
def reflection_pad(g, x, padding):
    return _pad(g, x, padding, _reflect)


@lowering(aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d)
def replication_pad(g, x, padding):
    return _pad(g, x, padding, _replicate)

