"""Elementwise ops: math, comparisons, logic, casts, where, clamp, activations."""
from __future__ import annotations

import math

import sympy
import torch

from ..ir import ops
from ..ir.ops import ReadsHandler, use_handler
from ..symbolic import index_var
from .extern_calls import device_copy
from .half_rounding import rounded_to_half
from .common import common_dtype, in_dtype, is_tensor, make_pointwise, scalar_operand_dtypes, upcast_half
from .registry import lowering

aten = torch.ops.aten
prims = torch.ops.prims

# ATen op -> ops vocabulary name, for ops computed in the output dtype.
_UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1",
    aten.log: "log", aten.log2: "log2", aten.log10: "log10", aten.log1p: "log1p",
    aten.rsqrt: "rsqrt", aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin",
    aten.acos: "acos", aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf", aten.erfc: "erfc",
    aten.erfinv: "erfinv", aten.floor: "floor",  # sqrt, reciprocal, sigmoid: below
    aten.ceil: "ceil", aten.trunc: "trunc", aten.sign: "sign", aten.bitwise_not: "bitwise_not",
    aten.lgamma: "lgamma", prims.bessel_i0: "i0",
}
_BINARY = {
    aten.mul: "mul", prims.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.atan2: "atan2",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
    aten.bitwise_left_shift: "left_shift", aten.bitwise_right_shift: "right_shift", aten.fmod: "fmod",
    aten.copysign: "copysign", aten.hypot: "hypot",  # floor_divide, remainder, div: division.py
}
# Ops whose result is bool: inputs are promoted among themselves first.
_PREDICATES = {
    aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge",
    aten.logical_and: "logical_and", aten.logical_or: "logical_or", aten.logical_xor: "logical_xor",
}


# Binary ops whose kernels read a Python number operand converted to a half-float dtype, on the
# CPU and on CUDA (common.in_dtype); mul's reads it unconverted.
_SCALAR_IN_DTYPE = {aten.fmod}


def _in_dtypes(g, args, dtype=None, cpu_only=False):
    """in_dtype of each of args, in the op's dtype (default: its output's). cpu_only: the op's CUDA
    kernel reads a number unconverted, in float32."""
    if cpu_only and g.out_meta.device.type != "cpu":
        return list(args)
    dtype = dtype or g.out_meta.dtype
    return [in_dtype(a, dtype) for a in args]


def _register_table():
    for op, name in _UNARY.items():
        lowering(op)(lambda g, x, _name=name: make_pointwise(g, [x], getattr(ops, _name)))
    for op, name in _BINARY.items():
        if op in (aten.mul, prims.mul):
            lowering(op)(lambda g, a, b: make_pointwise(g, [a, b], ops.mul,
                                                        compute_dtype=scalar_operand_dtypes(g, a, b)))
        elif op in _SCALAR_IN_DTYPE:
            lowering(op)(lambda g, a, b, _name=name: make_pointwise(g, _in_dtypes(g, [a, b]), getattr(ops, _name)))
        else:
            lowering(op)(lambda g, a, b, _name=name: make_pointwise(g, [a, b], getattr(ops, _name)))
    for op, name in _PREDICATES.items():
        lowering(op)(lambda g, a, b, _name=name: make_pointwise(
            g, _in_dtypes(g, [a, b], common_dtype(a, b)), getattr(ops, _name), compute_dtype=common_dtype(a, b)))


_register_table()


@lowering(aten.logical_not)
def logical_not(g, x):
    return make_pointwise(g, [x], ops.logical_not, compute_dtype=x.get_dtype())


@lowering(aten.isnan, aten.isinf)
def float_predicate(g, x):
    name = "isnan" if g.node.target.overloadpacket is aten.isnan else "isinf"
    if not x.get_dtype().is_floating_point:
        return make_pointwise(g, [x], lambda v: ops.constant(False, torch.bool), compute_dtype=x.get_dtype())
    return make_pointwise(g, [x], getattr(ops, name), compute_dtype=x.get_dtype())


@lowering(aten.add, aten.sub)
def add_sub(g, a, b, alpha=1):
    name = "add" if g.node.target.overloadpacket is aten.add else "sub"
    fn = getattr(ops, name)
    a, b, alpha = _in_dtypes(g, [a, b, alpha], cpu_only=True)  # ATen's CPU add rounds alpha too
    if alpha != 1:
        return make_pointwise(g, [a, b, alpha], lambda x, y, k: fn(x, ops.mul(y, k)))
    return make_pointwise(g, [a, b], fn)


@lowering(aten.rsub)
def rsub(g, a, b, alpha=1):
    a, b, alpha = _in_dtypes(g, [a, b, alpha], cpu_only=True)
    return make_pointwise(g, [a, b, alpha], lambda x, y, k: ops.sub(y, ops.mul(x, k)))


@lowering(aten.pow)
def pow_(g, a, b):
    out = g.out_meta.dtype
    if not (out.is_floating_point or out.is_complex or out == torch.bool):
        return _integer_pow(g, a, b, out)
    if is_tensor(a) and not is_tensor(b) and isinstance(b, (int, float, sympy.Number)):
        exponent = float(b)
        # ATen's pow takes square roots for exponents of +-0.5 (sqrt(-0.) is -0., rsqrt(-inf) nan,
        # where pow gives +0. and 0.), but on the CPU not for float16, which it raises with pow itself.
        roots = not (out == torch.float16 and g.out_meta.device.type == "cpu")
        if exponent == 2:
            return make_pointwise(g, [a], lambda x: ops.mul(x, x))
        if exponent == 0.5 and roots:
            return make_pointwise(g, [a], ops.sqrt)
        if exponent == -0.5 and roots and out.is_floating_point:
            return make_pointwise(g, [a], ops.rsqrt)
        if exponent == -1 and g.out_meta.dtype.is_floating_point:
            return make_pointwise(g, [a], ops.reciprocal)
        if exponent == 1:
            return make_pointwise(g, [a], lambda x: x)
        if exponent == 3:
            device = g.out_meta.device.type
            if (out == torch.bfloat16 and device == "cpu") or (out in (torch.bfloat16, torch.float16) and device == "cuda"):
                # ATen multiplies base * base * base in the half type (its square rounded): on the
                # CPU for bfloat16 (float16 is cubed in float32 there), on CUDA for both (checked in
                # eager on the H100). rsqrt's backward cubes rsqrt: one rounding less flipped a
                # bfloat16 RMSNorm gradient's sign (fuzzer).
                return make_pointwise(g, [a], lambda x: ops.mul(ops.to_dtype(ops.mul(x, x), out), x))
            return make_pointwise(g, [a], lambda x: ops.mul(ops.mul(x, x), x))
    return make_pointwise(g, _in_dtypes(g, [a, b]), ops.pow)


_UNSIGNED = {torch.int32: torch.uint32, torch.int64: torch.uint64}


def _wrapping_mul(a, b, dtype):
    """a * b modulo 2**bits: Halide holds a signed 32/64-bit overflow undefined (and refuses one
    it meets while folding constants), so those multiply as unsigned."""
    unsigned = _UNSIGNED.get(dtype)
    if unsigned is None:
        return ops.mul(a, b)
    return ops.to_dtype(ops.mul(ops.to_dtype(a, unsigned), ops.to_dtype(b, unsigned)), dtype)


def _integer_pow(g, a, b, dtype):
    """Eager's integer pow: square-and-multiply, wrapping as the dtype does; a negative exponent
    gives 1 for a base of 1, +-1 for -1 and 0 otherwise (eager refuses a negative Python one)."""
    mul = lambda x, y: _wrapping_mul(x, y, dtype)  # noqa: E731
    if isinstance(b, (int, sympy.Integer)) and not isinstance(b, bool) and int(b) >= 0:
        exponent = int(b)

        def static(x):
            result, base, e = None, x, exponent
            while e:
                if e & 1:
                    result = base if result is None else mul(result, base)
                e >>= 1
                if e:
                    base = mul(base, base)
            return ops.constant(1, dtype) if result is None else result
        return make_pointwise(g, [a], static)
    bits = dtype.itemsize * 8 - (1 if dtype.is_signed else 0)

    def dynamic(x, e):
        one, zero = ops.constant(1, dtype), ops.constant(0, dtype)
        result, base, rest = one, x, e
        for k in range(bits):
            odd = ops.ne(ops.bitwise_and(rest, one), zero)
            result = ops.where(odd, mul(result, base), result)
            if k + 1 < bits:
                base, rest = mul(base, base), ops.right_shift(rest, one)
        if not dtype.is_signed:
            return result
        odd = ops.ne(ops.bitwise_and(e, one), zero)
        minus_one = ops.where(odd, ops.constant(-1, dtype), one)
        negative = ops.where(ops.eq(x, one), one, ops.where(ops.eq(x, ops.constant(-1, dtype)), minus_one, zero))
        return ops.where(ops.lt(e, zero), negative, result)
    return make_pointwise(g, [a, b], dynamic)


@lowering(aten.where)
def where(g, cond, a, b):
    out = g.out_meta.dtype
    return make_pointwise(g, [cond, *_in_dtypes(g, [a, b])], ops.where, compute_dtype=[torch.bool, out, out])


@lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def clamp(g, x, min=None, max=None):
    if g.node.target.overloadpacket is aten.clamp_max:
        min, max = None, min
    # Number bounds in the half float itself: clamp_min(x_fp16, 1e-12) is max(x, 0), which a
    # fused division after it must see (F.normalize of a zero column is nan in eager).
    min, max = _in_dtypes(g, [min, max])
    args, bounds = [x], []
    for bound, op in ((min, ops.maximum), (max, ops.minimum)):
        if bound is not None:
            args.append(bound)
            bounds.append(op)

    def fn(v, *limits):
        for op, limit in zip(bounds, limits):
            v = op(v, limit)
        return v
    return make_pointwise(g, args, fn)


@lowering(aten.relu)
def relu(g, x):
    return make_pointwise(g, [x], ops.relu)


@lowering(aten.gelu)
def gelu(g, x, approximate="none"):
    # Half floats compute in float32 as eager does; float32 and float64 in their own type.
    compute = upcast_half(g.out_meta.dtype)

    def c(value):
        return ops.constant(value, compute)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)

        def fn(v):
            inner = ops.mul(c(k), ops.add(v, ops.mul(c(0.044715), ops.mul(ops.mul(v, v), v))))
            return ops.mul(ops.mul(c(0.5), v), ops.add(c(1.0), ops.tanh(inner)))
    else:
        def fn(v):
            cdf = ops.add(c(1.0), ops.erf(ops.mul(v, c(1 / math.sqrt(2)))))
            return ops.mul(ops.mul(v, c(0.5)), cdf)
    return make_pointwise(g, [x], fn, compute_dtype=compute)


def _rounded_to_half(g) -> bool:
    """Whether eager rounds this op's float result to a half float before any use: its division
    or root may then be the GPU's approximate one (half_rounding.py)."""
    return rounded_to_half(g.node, g.half_rounding_memo)


@lowering(aten.sqrt)
def sqrt(g, x):
    return make_pointwise(g, [x], ops.approx_sqrt if _rounded_to_half(g) else ops.sqrt)


@lowering(aten.reciprocal)
def reciprocal(g, x):
    if not _rounded_to_half(g):
        return make_pointwise(g, [x], ops.reciprocal)
    compute = upcast_half(g.out_meta.dtype)
    return make_pointwise(g, [x], lambda v: ops.approx_truediv(ops.constant(1.0, compute), v), compute_dtype=compute)


@lowering(aten.sigmoid)
def sigmoid(g, x):
    if not _rounded_to_half(g):
        return make_pointwise(g, [x], ops.sigmoid)
    compute = upcast_half(g.out_meta.dtype)

    def fn(v):
        one = ops.constant(1.0, compute)
        return ops.approx_truediv(one, ops.add(one, ops.exp(ops.neg(v))))
    return make_pointwise(g, [x], fn, compute_dtype=compute)


@lowering(aten.silu)
def silu(g, x):
    # Eager's x / (1 + exp(-x)), one rounding after the exp and sum: x * sigmoid(x) rounds twice
    # and was a float32 ulp off at x = 0.8121 (found by the fuzzer).
    compute = upcast_half(g.out_meta.dtype)
    divide = ops.approx_truediv if _rounded_to_half(g) else ops.truediv

    def fn(v):
        return divide(v, ops.add(ops.constant(1.0, compute), ops.exp(ops.neg(v))))
    return make_pointwise(g, [x], fn, compute_dtype=compute)


@lowering(aten._to_copy, prims.convert_element_type)
def to_copy(g, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    meta = g.out_meta
    if meta.device != x.get_device():
        if x.get_device().type == "cpu" and _from_literals_alone(x):
            # Computed where it is going (DeBERTa's `torch.tensor(mid - 1).type_as(positions)`):
            # no CPU kernel, no copy to the GPU; readers on the GPU inline it.
            return make_pointwise(g, [x], lambda v: v, compute_dtype=x.get_dtype(), out_dtype=meta.dtype)
        return device_copy(g, x, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                           non_blocking=non_blocking, memory_format=memory_format)
    return make_pointwise(g, [x], lambda v: v, compute_dtype=x.get_dtype(), out_dtype=meta.dtype)


class _LiteralsOnly(ReadsHandler):
    """ReadsHandler that also notes a random draw (a CPU generator's numbers differ from a GPU's)."""

    drawn = False

    def _draw(self, *args):
        self.drawn = True
        return "draw"
    rand = randn = randint64 = _draw


def _from_literals_alone(x) -> bool:
    """Whether every element of `x` comes from constants and index arithmetic: no memory read, no
    random number."""
    try:
        load = x.make_loader()
    except AssertionError:  # a reduction, stored before anyone reads it
        return False
    handler = _LiteralsOnly()
    with use_handler(handler):
        load([index_var(f"i{k}") for k in range(len(x.get_size()))])
    return not handler.reads and not handler.drawn


@lowering(aten.clone, aten.lift_fresh_copy)
def clone(g, x, memory_format=None):
    return make_pointwise(g, [x], lambda v: v)


@lowering(aten.alias)
def alias(g, x):
    # A view of the whole tensor, as in eager. Lowered as a copy, each attention output a training
    # forward saved through alias(alias(out)) was stored twice (Qwen2: 8 MiB a layer on the H100).
    return x


@lowering(aten.masked_fill)
def masked_fill(g, x, mask, value):
    out = g.out_meta.dtype
    return make_pointwise(g, [mask, in_dtype(value, out), x], ops.where, compute_dtype=[torch.bool, out, out])


@lowering(aten.lerp)
def lerp(g, start, end, weight):
    return make_pointwise(g, [start, end, weight], lambda s, e, w: ops.add(s, ops.mul(w, ops.sub(e, s))))


@lowering(prims.fma)
def fma(g, a, b, c):
    # prims.fma rounds once (addcmul decomposes to it). Floats narrower than float64 multiply
    # exactly in float64 and the sum rounds there, then once more to the output's type.
    out = g.out_meta.dtype
    wide = torch.float64 if out.is_floating_point and out != torch.float64 else out
    return make_pointwise(g, [a, b, c], lambda x, y, z: ops.add(ops.mul(x, y), z), compute_dtype=wide)


@lowering(aten.addcmul)
def addcmul(g, x, a, b, value=1):
    return make_pointwise(g, [x, a, b, value], lambda v, p, q, k: ops.add(v, ops.mul(k, ops.mul(p, q))))


@lowering(aten.addcdiv)
def addcdiv(g, x, a, b, value=1):
    return make_pointwise(g, [x, a, b, value], lambda v, p, q, k: ops.add(v, ops.mul(k, ops.truediv(p, q))))


@lowering(aten.sigmoid_backward)
def sigmoid_backward(g, grad, y):
    one = 1.0
    return make_pointwise(g, [grad, y, one], lambda dy, s, o: ops.mul(dy, ops.mul(s, ops.sub(o, s))))


@lowering(aten.tanh_backward)
def tanh_backward(g, grad, y):
    return make_pointwise(g, [grad, y, 1.0], lambda dy, t, o: ops.mul(dy, ops.sub(o, ops.mul(t, t))))


@lowering(aten.threshold_backward)
def threshold_backward(g, grad, x, threshold):
    return make_pointwise(g, [grad, x, threshold, 0],
                          lambda dy, v, t, z: ops.where(ops.le(v, t), z, dy))
