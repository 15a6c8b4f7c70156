"""oneDNN's bfloat16 convolution weight gradient on the CPU is wrong on some strided shapes: taps
whose windows read only padding come back never written (NaN, 1e38) and their neighbours' sums
wrong, from NCHW and channels-last operands alike (CPU fuzz seed 4302: a depthwise [1, 8, 2, 1]
input, 4x3 window, stride 2; about 1-3% of small strided shapes, none at stride 1, none in float16
or float32; `benchmarks/probes/onednn_channels_last_weight_gradient.py`). Eager gives the same
wrong values when its freed memory holds them. Such a weight gradient is computed from float32
copies of its operands and rounded once, as oneDNN's float32 sums would be; the input's and the
bias's gradients stay the bfloat16 call's."""
from __future__ import annotations

import logging

import torch

from ..ir import TensorBox
from .common import make_pointwise
from .extern_nodes import make_extern

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")


def faults(x, stride, output_mask) -> bool:
    """Whether a convolution backward over input `x` asks oneDNN for a bfloat16 weight gradient
    with a stride."""
    return x.get_device().type == "cpu" and x.get_dtype() == torch.bfloat16 and bool(output_mask[1]) \
        and any(int(s) > 1 for s in stride)


def weight_gradient(g, grad, x, weight, middle, meta):
    """The weight's gradient of convolution_backward(grad, x, weight, *middle, ...) as `meta`
    describes it, computed by ATen from float32 copies of the operands and rounded once."""
    log.debug("smelt: %s's bfloat16 weight gradient is computed in float32 (oneDNN's is wrong on some "
              "strided shapes)", g.node.name)

    def widened(t):
        t = t if isinstance(t, TensorBox) else TensorBox.of_storage(t)  # a buffer stored for several readers
        return make_pointwise(g, [t], lambda v: v, compute_dtype=torch.float32, out_dtype=torch.float32,
                              size=t.get_size())
    wide_meta = meta.new_empty_strided(meta.shape, meta.stride(), dtype=torch.float32)
    wide = make_extern(g, aten.convolution_backward.default,
                       (widened(grad), widened(x), widened(weight), *middle, [False, True, False]), {},
                       is_fallback=False, meta=(None, wide_meta, None))[1]
    return make_pointwise(g, [wide], lambda v: v, compute_dtype=torch.float32, out_dtype=meta.dtype,
                          size=wide.get_size())


def lower(g, args) -> tuple:
    """convolution_backward(*args)'s (input, weight, bias) gradients, the weight's from float32 operands."""
    grad, x, weight = args[:3]
    middle, output_mask = args[3:10], list(args[10])
    metas = g.out_meta
    weight_grad = weight_gradient(g, grad, x, weight, middle, metas[1])
    if not (output_mask[0] or output_mask[2]):
        return None, weight_grad, None
    rest = make_extern(g, aten.convolution_backward.default,
                       (grad, x, weight, *middle, [output_mask[0], False, output_mask[2]]), {}, is_fallback=False,
                       meta=(metas[0] if output_mask[0] else None, None, metas[2] if output_mask[2] else None))
    return rest[0], weight_grad, rest[2]
