"""Random ops: rand, randn, randint, bernoulli, dropout, and the distributions built from them.

Every random op becomes a Pointwise node whose element at logical (row-major) position i is a
Philox value of (seed, i), the seed being the op's own slot in the graph's RandomSeeds. A value
depends on nothing else, so the node fuses and inlines like any pointwise op: dropout is one
kernel (draw, compare with p, mask, scale), and a node read twice gives the same values twice.

Reproducibility: a call draws its seeds from torch's default generator, so `torch.manual_seed(s)`
before two calls gives the same values, and two calls without reseeding give different ones. The
values are not eager's (eager runs another generator); the distributions are the same.
"""
from __future__ import annotations

import math
from typing import Callable

import sympy
import torch

from ..ir import Pointwise, TensorBox, ops
from ..ir.random_seeds import RandomSeeds
from ..symbolic import contiguous_strides, sympify
from .common import broadcast_loader, is_tensor, scalar_value
from .registry import lowering

aten = torch.ops.aten

# Mantissa bits of the half floats: a uniform value with no more bits than these is exact in that
# dtype, so rounding it to the output dtype can never make it 1.0.
_MANTISSA_BITS = {torch.float16: 11, torch.bfloat16: 8}


def _seed_slot(g, device: torch.device) -> tuple[str, int]:
    """(seeds buffer, position of a fresh seed in it) for one random op on `device`."""
    seeds = g.random_seeds.get(device)
    if seeds is None:
        seeds = RandomSeeds(g.new_name(), device, g.origin)
        g.register_buffer(seeds)
        g.random_seeds[device] = seeds
    return seeds.name, seeds.reserve()


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    return torch.float32 if dtype.is_floating_point else torch.int64


def _random_node(g, slot, draw: Callable, combine: Callable, inputs=(), size=None, dtype=None,
                 device=None) -> TensorBox:
    """out[i] = combine(draw(seed, offset of i), *inputs at i), with `inputs` tensors (broadcast to
    the output) or Python / symbolic scalars. Size, dtype and device default to the op's output."""
    meta = g.out_meta
    size = [sympify(s) for s in (meta.shape if size is None else size)]
    dtype = dtype or meta.dtype
    device = device or meta.device
    compute = _compute_dtype(dtype)
    seeds, position = slot
    strides = contiguous_strides(size)
    loaders = [broadcast_loader(x, size) if is_tensor(x) else None for x in inputs]

    def inner_fn(index):
        offset = ops.index_expr(sum((i * s for i, s in zip(index, strides)), sympy.Integer(0)), torch.int64)
        value = draw(ops.load(seeds, sympy.Integer(position)), offset)
        args = [scalar_value(x, compute) if load is None else ops.to_dtype(load(index), compute)
                for x, load in zip(inputs, loaders)]
        return ops.to_dtype(combine(value, *args), dtype)

    origins = g.origin.union(*[x.origins for x in inputs if is_tensor(x)])
    return TensorBox.of_storage(Pointwise(device, dtype, inner_fn, size, origins))


def _uniform_draw(dtype: torch.dtype, exact_in_dtype: bool = False) -> Callable:
    """U[0, 1) in the compute dtype of `dtype`. With `exact_in_dtype`, a half-float value keeps
    only the bits that dtype has, so rounding it to the output can never give 1.0; transforms
    (log, tan, ...) want every bit instead, or their tails would be cut short."""
    compute = _compute_dtype(dtype)
    bits = _MANTISSA_BITS.get(dtype) if exact_in_dtype else None

    def draw(seed, offset):
        u = ops.to_dtype(ops.rand(seed, offset), compute)
        if bits is None:
            return u
        scale = float(2 ** bits)
        return ops.mul(ops.floor(ops.mul(u, ops.constant(scale, compute))), ops.constant(1.0 / scale, compute))
    return draw


def _normal_draw(dtype: torch.dtype) -> Callable:
    compute = _compute_dtype(dtype)
    return lambda seed, offset: ops.to_dtype(ops.randn(seed, offset), compute)


def _uniform(g, combine: Callable = lambda u: u, inputs=(), exact_in_dtype: bool = False) -> TensorBox:
    draw = _uniform_draw(g.out_meta.dtype, exact_in_dtype)
    return _random_node(g, _seed_slot(g, g.out_meta.device), draw, combine, inputs)


def _normal(g, combine: Callable = lambda n: n, inputs=()) -> TensorBox:
    return _random_node(g, _seed_slot(g, g.out_meta.device), _normal_draw(g.out_meta.dtype), combine, inputs)


def _no_generator(kwargs) -> bool:
    """Ops given an explicit torch.Generator run in ATen, which owns that generator's state."""
    return kwargs.get("generator") is None


# ------------------------------------------------------------------ uniform and normal


@lowering(aten.rand.default, aten.rand_like.default)
def rand(g, *args, **kwargs):
    return _uniform(g, exact_in_dtype=True)


@lowering(aten.uniform.default)
def uniform(g, x, low=0.0, high=1.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _uniform(g, lambda u, lo, hi: ops.add(lo, ops.mul(u, ops.sub(hi, lo))), (low, high), exact_in_dtype=True)


@lowering(aten.randn.default, aten.randn_like.default)
def randn(g, *args, **kwargs):
    return _normal(g)


def _scaled_normal(n, mean, std):
    return ops.add(mean, ops.mul(n, std))


@lowering(aten.normal_functional.default)
def normal_functional(g, x, mean=0.0, std=1.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _normal(g, _scaled_normal, (mean, std))


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal(g, mean, std=1.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _normal(g, _scaled_normal, (mean, std))


@lowering(aten.normal.float_float)
def normal_float_float(g, mean, std, size, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _normal(g, _scaled_normal, (mean, std))


@lowering(aten.log_normal.default)
def log_normal(g, x, mean=1.0, std=2.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _normal(g, lambda n, m, s: ops.exp(_scaled_normal(n, m, s)), (mean, std))


# ------------------------------------------------------------------ inverse-CDF distributions


@lowering(aten.exponential.default)
def exponential(g, x, lambd=1.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    # -log(1 - u) / lambda; 1 - u lies in (0, 1], so the log is finite.
    return _uniform(g, lambda u, rate: ops.truediv(ops.neg(ops.log1p(ops.neg(u))), rate), (lambd,))


@lowering(aten.cauchy.default)
def cauchy(g, x, median=0.0, sigma=1.0, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented

    def combine(u, m, s):
        angle = ops.mul(ops.sub(u, ops.constant(0.5, torch.float32)), ops.constant(math.pi, torch.float32))
        return ops.add(m, ops.mul(s, ops.tan(angle)))
    return _uniform(g, combine, (median, sigma))


@lowering(aten.geometric.default)
def geometric(g, x, p, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    # Trials until the first success: ceil(log(1 - u) / log(1 - p)), at least 1.
    log_fail = math.log1p(-p) if p < 1 else float("-inf")

    def combine(u):
        trials = ops.ceil(ops.truediv(ops.log1p(ops.neg(u)), ops.constant(log_fail, torch.float32)))
        return ops.maximum(trials, ops.constant(1.0, torch.float32))
    return _uniform(g, combine)


# ------------------------------------------------------------------ integers


def _randint(g, low, high) -> TensorBox:
    def draw(seed, offset):
        return ops.randint64(seed, offset, scalar_value(low, torch.int64), scalar_value(high, torch.int64))
    return _random_node(g, _seed_slot(g, g.out_meta.device), draw, lambda v: v)


@lowering(aten.randint.default)
def randint(g, high, size, **kwargs):
    return _randint(g, 0, high)


@lowering(aten.randint.low)
def randint_low(g, low, high, size, **kwargs):
    return _randint(g, low, high)


@lowering(aten.randint_like.default)
def randint_like(g, x, high, **kwargs):
    return _randint(g, 0, high)


@lowering(aten.randint_like.low_dtype)
def randint_like_low(g, x, low, high, **kwargs):
    return _randint(g, low, high)


# ------------------------------------------------------------------ bernoulli and dropout


def _bernoulli(g, p) -> TensorBox:
    """1 with probability p (a tensor, or one float for every element), else 0."""
    slot = _seed_slot(g, g.out_meta.device)
    return _random_node(g, slot, _uniform_draw(torch.float32), ops.lt, (p,))


@lowering(aten.bernoulli.default)
def bernoulli(g, p, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _bernoulli(g, p)


@lowering(aten.bernoulli.p, aten.bernoulli.Tensor)
def bernoulli_p(g, x, p=0.5, **kwargs):
    if not _no_generator(kwargs):
        return NotImplemented
    return _bernoulli(g, p)


@lowering(aten.native_dropout.default)
def native_dropout(g, x, p, train):
    out_meta = g.out_meta[0]
    size = x.get_size()
    if train is False:
        load = x.make_loader()
        device = x.get_device()
        out = Pointwise(device, x.get_dtype(), load, size, g.origin | x.origins)
        mask = Pointwise(device, torch.bool, lambda index: ops.constant(True, torch.bool), size, g.origin)
        return TensorBox.of_storage(out), TensorBox.of_storage(mask)
    # Keep an element with probability 1 - p, as eager's bernoulli(1 - p) mask does; the output
    # is input * mask * scale, so a dropped inf or nan gives nan there too.
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    slot = _seed_slot(g, x.get_device())  # one stream for both outputs: they agree element by element
    draw = _uniform_draw(torch.float32)
    value_dtype = _compute_dtype(x.get_dtype())

    def kept(u):
        return ops.ge(u, ops.constant(float(p), torch.float32))

    def scaled(u, value):
        keep = ops.to_dtype(kept(u), value_dtype)
        return ops.mul(ops.mul(value, keep), ops.constant(scale, value_dtype))

    out = _random_node(g, slot, draw, scaled, (x,), size=size, dtype=out_meta.dtype, device=x.get_device())
    mask = _random_node(g, slot, draw, kept, size=size, dtype=torch.bool, device=x.get_device())
    return out, mask
