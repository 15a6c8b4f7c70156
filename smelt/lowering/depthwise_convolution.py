"""Depthwise convolutions as smelt kernels: each output element is a sum of a few weighted input
elements of its own channel, so it lowers like a pool (a window of masked loads, unrolled) and
fuses with the norm and activation that follow.

cuDNN runs these slowly: ConvNeXt-tiny's 18 7x7 depthwise convolutions (bf16, batch 32, NHWC)
took 0.737 of its 2.45 GPU ms on the H100, where reading and writing their tensors once takes
about 0.1 ms. SMELT_DEPTHWISE_KERNELS=on lowers here every convolution whose every group has one
input channel and a window of at most `TAP_LIMIT` elements; "auto" takes windows up to the
Target's `depthwise_kernel_taps` (3x3 and 5x5 on the GPU, none on the CPU), 2-D windows outside
CUDA graphs.

Each tap is a load from L1 (nothing reuses a loaded row across the window), so a 7x7 window runs
at 5-7% of the bandwidth floor, 2x slower than cuDNN; 3x3 windows beat cuDNN by 1.0-4.7x alone,
but fused into reductions (ConvNeXt's layer norm, a squeeze-excite mean) they are slower again
(benchmarks/probes/depthwise_conv.py, RESULTS 2026-11-27 seventh session). In whole models they
cost a few percent of GPU time and save cuDNN's host time and its first call per shape (target.py).
"""
from __future__ import annotations

import itertools
import logging

import torch

from ..ir import Pointwise, StorageBox, TensorBox, ops
from ..symbolic import FloorDiv, product, static_int, sympify
from .common import upcast_half
from .pooling import Window, _all, _expand
from .traced_layout import realize_in_traced_order

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

# Window elements one kernel reads one by one: ConvNeXt's 7x7.
TAP_LIMIT = 49


def depthwise_windows(g, x, weight, stride, padding, dilation, transposed, groups,
                      tap_limit: int) -> list[Window] | None:
    """The windows of a convolution to lower here, or None where ATen should run it (and why, logged)."""
    in_size, w_size = x.get_size(), weight.get_size()
    n = len(in_size) - 2
    channels, out_channels = static_int(in_size[1]), static_int(w_size[0])
    taps = [static_int(s) for s in w_size[2:]]
    why = None
    if transposed:
        why = "transposed"
    elif n < 1 or channels is None or out_channels is None or None in taps:
        why = "sizes not known at compile time"
    elif static_int(w_size[1]) != 1 or groups != channels or out_channels % channels:
        return None  # not depthwise: an ordinary convolution for cuDNN / oneDNN
    elif product(taps) > tap_limit:
        why = f"a window of {product(taps)} elements (over {tap_limit})"
    if why is not None:
        log.debug("smelt: depthwise convolution of %s runs in ATen: %s", list(in_size), why)
        return None
    out_size = [sympify(s) for s in g.out_meta.shape[2:]]
    return [Window(sympify(s), o, k, int(st), int(p), int(d))
            for s, o, k, st, p, d in zip(in_size[2:], out_size, taps, _expand(stride, n), _expand(padding, n),
                                         _expand(dilation, n))]


def lower_depthwise(g, x, weight, bias, windows: list[Window]) -> TensorBox:
    """sum over the window of x[n, c // multiplier, pos] * weight[c, 0, tap] (+ bias[c]), in float32
    for half floats and rounded once, as cuDNN accumulates."""
    dtype = g.out_meta.dtype
    compute = upcast_half(dtype)
    # Each input element is read by every window over it (up to 49): a norm and activation before
    # the convolution are computed once into memory, not once per read.
    load_x, load_w = (_stored(g, box, fx_node).make_loader() for box, fx_node in ((x, g.node.args[0]),
                                                                                  (weight, g.node.args[1])))
    multiplier = static_int(weight.get_size()[0]) // static_int(x.get_size()[1])
    load_bias = bias.make_loader() if bias is not None else None
    n = len(windows)

    def element(index):
        batch, channel, outs = index[0], index[1], index[2:]
        source = channel if multiplier == 1 else FloorDiv(channel, multiplier)
        total = None
        for taps in itertools.product(*(range(w.length) for w in windows)):
            pos = [w.position(o, k) for w, o, k in zip(windows, outs, taps)]
            inside = _all([w.inside(o, k) for w, o, k in zip(windows, outs, taps)])
            read = lambda pos=pos: ops.to_dtype(load_x([batch, source, *pos]), compute)  # noqa: E731
            value = read() if inside is None else ops.masked(inside, read, 0.0)
            term = ops.mul(value, ops.to_dtype(load_w([channel, sympify(0), *map(sympify, taps)]), compute))
            total = term if total is None else ops.add(total, term)
        if load_bias is not None:
            total = ops.add(total, ops.to_dtype(load_bias([channel]), compute))
        return ops.to_dtype(total, dtype)

    size = [sympify(s) for s in g.out_meta.shape]
    assert len(size) == n + 2
    origins = g.origin | x.origins | weight.origins
    result = TensorBox.of_storage(Pointwise(x.get_device(), dtype, element, size, origins))
    if _read_through_views(g.node):
        # Each reader of an unrealized loop nest recomputes it: a norm after a permute (ConvNeXt)
        # would sum the window twice per element. Stored once, as cuDNN would.
        realize_in_traced_order(g, result.data, g.node)
    return result


def _stored(g, box: TensorBox, fx_node):
    """`box` in memory: its loop nest realized, or for a value its other readers recompute
    (StorageBox.keep_recomputed), the stored copy realizing it gives; the box itself would still
    load through the loop nest (EfficientNet's batch norm and SiLU were computed again for each of
    a 3x3 window's 9 reads, and the copy, read by nothing, dropped)."""
    if isinstance(box.data, StorageBox) and not box.data.is_realized():
        return realize_in_traced_order(g, box.data, fx_node)
    return box


def _read_through_views(node: torch.fx.Node) -> bool:
    """Whether FX node `node`'s value reaches its readers through view ops (the lowering's
    several-readers rule sees the view's readers, not the value's)."""
    return any(isinstance(user.target, torch._ops.OpOverload) and user.target.is_view for user in node.users)
