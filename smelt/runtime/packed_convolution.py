"""smelt::packed_convolution: a float32 2-D convolution on the CPU through oneDNN with its weight in
the blocked layout oneDNN's kernels read (mkldnn._reorder_convolution_weight, then
mkldnn._convolution_pointwise).

ATen's own path converts an NCHW weight to the channels-last activation's layout and oneDNN then
reorders it again, on every call: on 2 cores a [4, 512, 7, 7] 3x3 convolution took 9.2 ms that way
against 2.9 with the weight packed once, ResNet-18's 7x7 stem 6.4-9.7 against 3.2
(benchmarks/probes/packed_convolution.py). With `keep_packed` (SMELT_FREEZE_WEIGHTS,
whose contract this shares: a weight changed behind its version counter is not seen) the packed
weight is kept per weight tensor and made again when the weight is another tensor or its version
moved; without, it is packed on every call.
"""
import weakref
from typing import List

import torch

# id(weight) -> (weakref to the weight, its version, the conv's input size and arguments, packed weight):
# the weakref tells a live weight from a new tensor that took a dead one's id or memory.
_packed: dict = {}


@torch.library.custom_op("smelt::packed_convolution", mutates_args=())
def packed_convolution(x: torch.Tensor, weight: torch.Tensor, padding: List[int], stride: List[int],
                       dilation: List[int], groups: int, keep_packed: bool) -> torch.Tensor:
    """The convolution without a bias (the kernel after it adds one: Target.adds_convolution_bias)."""
    packed = _packed_weight(x, weight, padding, stride, dilation, groups, keep_packed)
    return torch.ops.mkldnn._convolution_pointwise(x, packed, None, padding, stride, dilation, groups, "none", [], None)


def _packed_weight(x, weight, padding, stride, dilation, groups, keep: bool):
    def pack():
        return torch.ops.mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups, list(x.shape))
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version counter: nothing tells a change
        keep = False
    if not keep:
        return pack()
    shape = (tuple(x.shape), tuple(padding), tuple(stride), tuple(dilation), groups)
    kept = _packed.get(id(weight))
    if kept is None or kept[0]() is not weight or kept[1] != version or kept[2] != shape:
        for key in [k for k, v in _packed.items() if v[0]() is None]:
            del _packed[key]
        kept = _packed[id(weight)] = (weakref.ref(weight), version, shape, pack())
    return kept[3]


@packed_convolution.register_fake
def _(x, weight, padding, stride, dilation, groups, keep_packed):
    n, _, *spatial = x.shape
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1
           for size, p, d, k, s in zip(spatial, padding, dilation, weight.shape[2:], stride)]
    return x.new_empty((n, weight.shape[0], *out)).contiguous(memory_format=torch.channels_last)


def available() -> bool:
    """Whether this torch has oneDNN's convolution ops (a CPU build with MKLDNN)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
