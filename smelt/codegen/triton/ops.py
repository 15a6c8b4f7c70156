"""How each op of the vocabulary prints in Triton, and how dtypes map to Triton's."""
from __future__ import annotations

import math

import torch

TRITON_DTYPE = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
    torch.uint16: "tl.uint16", torch.uint32: "tl.uint32", torch.uint64: "tl.uint64",
}


def triton_type(dtype: torch.dtype) -> str:
    try:
        return TRITON_DTYPE[dtype]
    except KeyError:
        raise NotImplementedError(f"smelt: Triton kernels do not support dtype {dtype}") from None


def literal(value, dtype: torch.dtype) -> str:
    """A Python literal for value in dtype, as Triton reads it inside a kernel."""
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(wrap_integer(int(value), dtype))


def wrap_integer(value: int, dtype: torch.dtype) -> int:
    """value as eager casts a Python int to an integer dtype: modulo 2**bits (int8_tensor + 300
    adds 44, uint8_tensor < -1 compares with 255). Triton rejects a literal out of its type's range."""
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.is_signed and value >= 1 << (bits - 1) else value


# Unary ops on floats: Triton builtins where they are as accurate as eager's, libdevice otherwise.
# exp, exp2, log, log2, sin and cos are libdevice's: on the GPU Triton's float32 tl.exp is
# ex2.approx(x * log2(e)), whose error grows with |x| (rounding x * log2(e) costs |x| * 2**-24
# relative), where libdevice's expf is what eager's CUDA kernels call; under the interpreter the
# tl builtins are numpy's float32 SIMD functions (exp up to 2.4 ulp, log 2.1, sin/cos 1.4, against
# eager's 0.5-0.9), where the interpreter's libdevice stand-ins are eager's own functions.
EXP = "libdevice.exp({0})"
FLOAT_UNARY = {
    "exp": EXP, "exp2": "libdevice.exp2({0})", "log": "libdevice.log({0})", "log2": "libdevice.log2({0})",
    "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "libdevice.sin({0})", "cos": "libdevice.cos({0})",
    "erf": "tl.erf({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    # Eager's 1 / (1 + exp(-x)), with its exp.
    "sigmoid": "1.0 / (1.0 + %s)" % EXP.format("-{0}"),
    "abs": "tl.abs({0})", "reciprocal": "1.0 / {0}", "isnan": "{0} != {0}",
    "isinf": 'tl.abs({0}) == float("inf")', "round": "libdevice.nearbyint({0})",
    "i0": "libdevice.cyl_bessel_i0({0})",
}
for _name in ("tanh expm1 log1p log10 tan asin acos atan sinh cosh asinh acosh atanh erfc erfinv "
              "lgamma trunc signbit rsqrt").split():
    FLOAT_UNARY[_name] = "libdevice.%s({0})" % _name

# float32 spellings where Triton's own is approximate on the GPU: `/` is div.full.f32 (2 ulp) and
# tl.sqrt sqrt.approx.ftz.f32 (denormals flushed), where eager's CUDA kernels divide and take roots
# correctly rounded (checked in the PTX Triton prints for sm_90; tests/test_cuda_rounding.py).
# float64's `/` and sqrt are exact already. rsqrt is libdevice's rsqrtf, the one eager calls: on
# the GPU the same approximate instruction as tl.rsqrt, under the interpreter eager's own function.
FLOAT32_DIV = "tl.div_rn({0}, {1})"
FLOAT32_UNARY = {
    "sqrt": "tl.sqrt_rn({0})",
    "sigmoid": FLOAT32_DIV.format("1.0", "1.0 + %s" % EXP.format("-{0}")),
    "reciprocal": FLOAT32_DIV.format("1.0", "{0}"),
}

# ops.approx_sqrt on float32 (a value eager rounds to a half float, lowering/half_rounding.py): PTX's
# sqrt.approx.f32, which keeps subnormal inputs, where libdevice.sqrt and tl.sqrt are
# sqrt.approx.ftz.f32 and flush them (bfloat16's sqrt(9e-41) is 9.6e-21, not 0); its results against
# eager's: tests/gpu/test_cuda_dtypes.py. The interpreter runs no PTX: there it is eager's sqrt.
APPROX_SQRT_F32 = ('tl.inline_asm_elementwise("sqrt.approx.f32 $0, $1;", "=f,f", [{0}], dtype=tl.float32, '
                   'is_pure=True, pack=1)')
APPROX_SQRT_F32_INTERPRETED = "libdevice.sqrt({0})"

INT_UNARY = {
    "abs": "tl.abs({0})", "bitwise_not": "~{0}", "floor": "{0}", "ceil": "{0}", "trunc": "{0}", "round": "{0}",
    "isnan": "{0} != {0}", "isinf": "{0} != {0}", "neg": "-{0}",
}

COMMON_UNARY = {
    "relu": "tl.where({0} < 0, 0, {0})",
}

INFIX = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
    "gt": ">", "ge": ">=", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "left_shift": "<<",
    "right_shift": ">>",
}
PREDICATE_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "isnan", "isinf",
                 "logical_not", "signbit"}
FLOAT_BINARY = {
    "pow": "libdevice.pow({0}, {1})", "atan2": "libdevice.atan2({0}, {1})",
    "copysign": "libdevice.copysign({0}, {1})", "hypot": "libdevice.hypot({0}, {1})",
    "fmod": "libdevice.fmod({0}, {1})", "nextafter": "libdevice.nextafter({0}, {1})",
    "maximum": "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    "minimum": "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
}
INT_BINARY = {
    "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})", "fmod": "{0} % {1}",
}

# Combine functions emitted into a kernel's module when its reductions need them.
# Only Triton builtins, tl.reduce with these helpers or with Triton's own combines appear in
# kernels: Triton's @jit library functions (tl.sum, tl.sigmoid, ...) cannot run under the
# interpreter unless it was on when Triton was imported.
COMBINE_HELPERS = {
    "_max_combine": '''@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_min_combine": '''@triton.jit
def _min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_int_max_combine": '''@triton.jit
def _int_max_combine(a, b):
    return tl.maximum(a, b)
''',
    "_int_min_combine": '''@triton.jit
def _int_min_combine(a, b):
    return tl.minimum(a, b)
''',
    "_prod_combine": '''@triton.jit
def _prod_combine(a, b):
    return a * b
''',
    # The first index wins ties, and NaN counts as the extreme value, as in eager.
    "_argmax_combine": '''@triton.jit
def _argmax_combine(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    a_first = a_index < b_index
    take_a = (a > b) | (a_nan & ~b_nan) | ((a == b) & a_first) | (a_nan & b_nan & a_first)
    return tl.where(take_a, a, b), tl.where(take_a, a_index, b_index)
''',
    "_argmin_combine": '''@triton.jit
def _argmin_combine(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    a_first = a_index < b_index
    take_a = (a < b) | (a_nan & ~b_nan) | ((a == b) & a_first) | (a_nan & b_nan & a_first)
    return tl.where(take_a, a, b), tl.where(take_a, a_index, b_index)
''',
    # Chan et al.'s parallel merge of two (mean, m2, count) partial results.
    "_welford_combine": '''@triton.jit
def _welford_combine(mean_a, m2_a, count_a, mean_b, m2_b, count_b):
    count = count_a + count_b
    share_b = count_b / tl.maximum(count, 1.0)  # counts are whole numbers: 0 / 1 when both are empty
    delta = mean_b - mean_a
    return mean_a + delta * share_b, m2_a + m2_b + delta * delta * count_a * share_b, count
''',
}


def cast_text(value: str, src: torch.dtype, dst: torch.dtype, interpret: bool) -> str:
    """`value` converted from src to dst."""
    if interpret and dst == torch.bfloat16:
        # The GPU rounds to nearest even; the interpreter's own conversion truncates floats and
        # reinterprets integers.
        if not src.is_floating_point:
            value = f"{value}.to(tl.float32)"
        return f"libdevice.round_to_bfloat16({value})"
    return f"{value}.to({triton_type(dst)})"
