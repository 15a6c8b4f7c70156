"""Program inputs, made reproducibly from a seed. A repro imports make_input from here."""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "transposed", "strided", "expanded", "channels_last")


def _values(shape, dtype, kind, high, gen):
    if kind == "index":  # int64 indices in [0, high)
        return torch.randint(0, max(high, 1), shape, generator=gen, dtype=torch.int64)
    if kind == "unique":  # along the last dim, distinct indices in [0, high) (a scatter's index)
        if not shape or shape[-1] == 0:
            return torch.zeros(shape, dtype=torch.int64)
        rows = torch.rand((*shape[:-1], high), generator=gen).argsort(dim=-1)
        return rows[..., : shape[-1]].contiguous()
    if kind == "positive":  # a variance: running_var of batch_norm
        return torch.rand(shape, generator=gen, dtype=torch.float64).add(0.5).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype == torch.uint8:
        return torch.randint(0, 20, shape, generator=gen, dtype=dtype)
    if not dtype.is_floating_point:
        return torch.randint(-9, 10, shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def make_input(shape, dtype=torch.float32, layout="contiguous", grad=False, seed=0, kind="value", high=0,
               device="cpu"):
    """A tensor of `shape` with `layout`'s strides (transposed: the last two dims swapped in memory;
    strided: every other element of a wider tensor; expanded: dim 0 broadcast from size 1;
    channels_last: a 4-D tensor in NHWC order) and values drawn from `seed`. kind "host" is a value
    that stays on the CPU whatever `device` is: a 0-d CPU tensor read by another device's ops, as
    Dynamo passes an unspecialized Python float."""
    shape = tuple(shape)
    if kind == "host":
        device = "cpu"
    gen = torch.Generator().manual_seed(seed)

    def values(s):
        return _values(s, dtype, kind, high, gen).to(device)

    if layout == "transposed" and len(shape) >= 2:
        t = values((*shape[:-2], shape[-1], shape[-2])).transpose(-1, -2)
    elif layout == "strided" and len(shape) >= 1:
        t = values((*shape[:-1], shape[-1] * 2))[..., ::2]
    elif layout == "expanded" and len(shape) >= 1:
        t = values((1, *shape[1:])).expand(shape)
    elif layout == "channels_last" and len(shape) == 4:
        t = values(shape).contiguous(memory_format=torch.channels_last)
    else:
        t = values(shape)
    t = t.detach()
    return t.requires_grad_() if grad else t
