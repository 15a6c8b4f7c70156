"""A 1x1 convolution too small for a library call to pay, as a reduction in smelt's IR.

A squeeze-excite block (EfficientNet, MobileNetV3, RegNetY) pools an activation to [N, C, 1, 1]
and runs two 1x1 convolutions over it, each 32 x C x C/4 multiply-adds or fewer at batch 32: a
microsecond of arithmetic behind a library call's host time (EfficientNet-B0's 32 such products
among its call's 165 launches, the host's wall 1.6x its GPU time; RESULTS 2026-12-03). As

    out[n, o, h, w] = sum over c of x[n, c, h, w] * weight[o, c, 0, 0]

each is a reduction whose inputs load through the pointwise values before it (the first
product's SiLU, the pool's division) and whose bias and activation join its kernel, where the
library call needed a kernel of its own for them.

Accumulates in float32 (float64 for float64), one rounding to the output's type after the bias,
as cuBLAS and cuDNN accumulate; the summation order is smelt's.
"""
from __future__ import annotations

import dataclasses
import logging

import sympy
import torch

from ..ir import Reduction, StorageBox, TensorBox, View, ops
from .common import is_dense, layout_of, make_pointwise
from .traced_layout import realize_view_base

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

# Multiply-adds above which "on" leaves a product to the library when the Target names no limit.
DEFAULT_MACS = 1 << 22
# A longer contraction is one program's serial loop per output: the library's tiling pays there.
MAX_CONTRACTION = 4096


def macs_limit(g, positions: int) -> int:
    """The most multiply-adds a product over `positions` pixels may have to run as a reduction
    here; 0: none does. By default only a pooled input's (one position, where any layout is the
    same): over an image, a channels-last result's bias still takes a kernel of its own after the
    sums (tests/test_small_products.py), and the GPU time against cuBLAS's is not measured yet."""
    setting = g.config.small_products if g.config is not None else "auto"
    if setting == "off" or (setting == "auto" and positions != 1):
        return 0
    limit = g.target_for(g.out_meta.device.type).small_product_macs
    return (limit or DEFAULT_MACS) if setting == "on" else limit


def lower_convolution(g, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The convolution as a reduction over its input channels, or None where it is not a small
    1x1 one (the caller runs it another way)."""
    meta = g.out_meta
    if not isinstance(meta, torch.Tensor) or meta.dim() != 4 or transposed or groups != 1:
        return None
    if meta.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return None
    if list(stride) != [1, 1] or list(padding) != [0, 0] or list(dilation) != [1, 1]:
        return None
    sizes = [*x.get_size(), *weight.get_size()]
    if not all(isinstance(s, (int, sympy.Integer)) for s in sizes):
        return None  # a symbolic batch or size: no bound on the work
    n, c_in, h, w = (int(s) for s in x.get_size())
    c_out, c_w, kh, kw = (int(s) for s in weight.get_size())
    if (kh, kw) != (1, 1) or c_w != c_in or x.get_dtype() != weight.get_dtype():
        return None
    limit = macs_limit(g, h * w)
    macs = n * h * w * c_out * c_in
    if not limit or macs > limit or c_in > MAX_CONTRACTION:
        return None
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32
    # Each input value is read once per output channel (each weight value once per position): a
    # producer inlined into the loads would run that many times (a norm and activation before the
    # product, C_out times an element). Realized, it runs once, as its own kernel's epilogue.
    realize_view_base(g, x, g.node.args[0])
    realize_view_base(g, weight, g.node.args[1])
    load_x, load_w = x.make_loader(), weight.make_loader()
    zero = sympy.Integer(0)

    def inner_fn(index, rindex):
        b, o, i, j = index
        (c,) = rindex
        return ops.mul(ops.to_dtype(load_x([b, c, i, j]), acc), ops.to_dtype(load_w([o, c, zero, zero]), acc))

    # The sums in eager's memory order (a channels-last output stays so): without a bias they are
    # the result, with no transposing copy after them. (Over an image a bias is still a kernel of
    # its own: macs_limit.)
    layout = layout_of(meta) if is_dense(meta) else None
    if layout is not None:
        layout = dataclasses.replace(layout, dtype=acc)
    total = TensorBox(StorageBox(g.register_computed(Reduction(
        meta.device, acc, inner_fn, [n, c_out, h, w], [c_in], "sum", acc, origins=g.origin | x.origins | weight.origins),
        layout=layout)))
    log.debug("smelt: %s as a reduction of %d multiply-adds (%s x %s)", g.node.name, macs,
              list(x.get_size()), list(weight.get_size()))
    if bias is None:
        return total if meta.dtype == acc else make_pointwise(g, [total], lambda v: v, compute_dtype=acc)
    per_channel = TensorBox(View(bias.data, [c_out, 1, 1], lambda index: index[:1], "bias"))
    return make_pointwise(g, [total, per_channel], ops.add, compute_dtype=acc)
