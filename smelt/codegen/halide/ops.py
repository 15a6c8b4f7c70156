"""How dtypes, literals, index expressions and each op of the vocabulary print in Halide's Python API.

Every printed value is an `hl.Expr` in generated code. Half floats are computed in float32 (as in
the Triton backend); an op's operands have one Halide type by the time a template is filled in.
"""
from __future__ import annotations

import functools
import math

import torch

from ...symbolic import IndexPrinter
from ..backends import KernelUnsupported
from ..common import register_dtype

HALIDE_TYPE = {
    torch.float32: "hl.Float(32)", torch.float64: "hl.Float(64)", torch.float16: "hl.Float(16)",
    torch.bfloat16: "hl.BFloat(16)", torch.int8: "hl.Int(8)", torch.int16: "hl.Int(16)", torch.int32: "hl.Int(32)",
    torch.int64: "hl.Int(64)", torch.uint8: "hl.UInt(8)", torch.bool: "hl.Bool()",
    torch.uint16: "hl.UInt(16)", torch.uint32: "hl.UInt(32)", torch.uint64: "hl.UInt(64)",
}


class UnsupportedInHalide(KernelUnsupported):
    """An op, dtype or kernel kind the Halide backend cannot print (yet); the message names it."""


def func_call(text: str) -> str:
    """A Func call as an Expr: hl.select given a bare call (a FuncRef) would make a Tuple of it."""
    return f"hl.Expr({text})"


def halide_type(dtype: torch.dtype) -> str:
    try:
        return HALIDE_TYPE[dtype]
    except KeyError:
        raise UnsupportedInHalide(f"smelt: Halide kernels do not support dtype {dtype}") from None


def literal(value, dtype: torch.dtype) -> str:
    """An hl.Expr literal of value in dtype's register type."""
    dtype = register_dtype(dtype)
    if dtype == torch.bool:
        return f"hl.Expr({bool(value)})"
    if dtype.is_floating_point:
        value = float(value)
        bits = dtype.itemsize * 8
        if value == 0 and math.copysign(1, value) < 0:
            # Halide's expression equality compares float constants by value, so its CSE took
            # x * -0.0 for x * 0.0 in one kernel; a reinterpreted sign bit is not a float constant.
            return f"hl.reinterpret(hl.Float({bits}), hl.u{bits}({1 << (bits - 1)}))"
        text = repr(value) if math.isfinite(value) else f'float("{value}")'
        return f"hl.f{bits}({text})"
    value = int(value)
    if dtype == torch.int32:
        return f"hl.i32({value})"
    if dtype == torch.int64:
        return f"hl.i64({value})"
    if dtype in (torch.uint32, torch.uint64):  # hl.cast takes a Python int only in int32's range
        return f"hl.u{dtype.itemsize * 8}({value})"
    return f"hl.cast({halide_type(dtype)}, {value})"


# Unary float ops; {0} is the operand, {t} its Halide type.
FLOAT_UNARY = {
    "exp": "exp({0})", "log": "log({0})", "sqrt": "hl.sqrt({0})", "sin": "hl.sin({0})", "cos": "hl.cos({0})",
    "tan": "hl.tan({0})", "asin": "hl.asin({0})", "acos": "hl.acos({0})", "atan": "hl.atan({0})",
    "sinh": "hl.sinh({0})", "cosh": "hl.cosh({0})", "tanh": "tanh({0}, {at})", "asinh": "hl.asinh({0})",
    "acosh": "hl.acosh({0})", "atanh": "hl.atanh({0})", "erf": "erf({0}, {at})", "erfc": "erfc({0}, {at})",
    "floor": "hl.floor({0})", "ceil": "hl.ceil({0})", "trunc": "hl.trunc({0})", "round": "hl.round({0})",
    "abs": "hl.abs({0})", "reciprocal": "1 / {0}", "rsqrt": "1 / hl.sqrt({0})",
    "sigmoid": "sigmoid({0}, {at})", "exp2": "exp2({0})",
    "log2": "log({0}) * hl.cast({t}, hl.f64(1.4426950408889634))",
    "log10": "log({0}) * hl.cast({t}, hl.f64(0.4342944819032518))",
    # Exact near 0 where exp(x) - 1 and log(1 + x) lose their digits (Kahan's trick: the rounding
    # error of u = exp(x) or 1 + x cancels in the ratio). u == 1 gives x itself; log1p takes log(u)
    # alone where u - 1 == x (large x, where x * log(u) would overflow; inf; -1).
    "expm1": "hl.select(exp({0}) == 1, {0}, hl.select(hl.abs({0}) < 0.5, (exp({0}) - 1) * ({0} / log(exp({0}))), "
             "exp({0}) - 1))",
    "log1p": "hl.select(1 + {0} == 1, {0}, hl.select((1 + {0}) - 1 == {0}, log(1 + {0}), "
             "log(1 + {0}) * ({0} / ((1 + {0}) - 1))))",
    "isnan": "hl.is_nan({0})", "isinf": "hl.is_inf({0})",
    "erfinv": "erfinv({0})", "i0": "i0({0})", "lgamma": "lgamma({0})",  # halide_special.py
    "signbit": "(hl.reinterpret(hl.UInt({bits}), {0}) >> {shift}) != 0",
    # Halide's unary minus is 0 - x, which turns -(+0.0) into +0.0 (eager: -0.0; an atan2 of it then
    # answered pi for -pi, CPU fuzz seed 1801): a product with -1 flips the sign bit of zeros too.
    "neg": "({0} * hl.cast({t}, -1))", "relu": "hl.select({0} < 0, hl.cast({t}, 0), {0})",
    # sign(nan) is 0 in eager, and sign(-0) is +0.
    "sign": "hl.select({0} > 0, hl.cast({t}, 1), hl.select({0} < 0, hl.cast({t}, -1), hl.cast({t}, 0)))",
}
# smelt's erf fits are good to about 1e-10 (halide/special.py), enough for float32 only: float64
# kernels with these run elsewhere (the Triton backend).
FLOAT64_UNPRINTED = {"erf", "erfc"}
INT_UNARY = {
    # abs and neg: wrapping_int_unary_text.
    "bitwise_not": "~{0}", "floor": "{0}", "ceil": "{0}", "trunc": "{0}",
    "round": "{0}", "isnan": "hl.Expr(False)", "isinf": "hl.Expr(False)",
    "relu": "hl.max({0}, hl.cast({t}, 0))", "signbit": "{0} < 0",
    "sign": "hl.select({0} > 0, hl.cast({t}, 1), hl.select({0} < 0, hl.cast({t}, -1), hl.cast({t}, 0)))",
}
BOOL_UNARY = {"bitwise_not": "~{0}", "logical_not": "~{0}", "abs": "{0}", "isnan": "hl.Expr(False)",
              "isinf": "hl.Expr(False)", "relu": "{0}", "sign": "{0}", "signbit": "hl.Expr(False)"}
PREDICATE_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "isnan", "isinf",
                 "logical_not", "signbit"}

# Eager's arithmetic on bools: True + True is True, True * False is False.
BOOL_ARITHMETIC = {"add": "|", "mul": "&", "maximum": "|", "minimum": "&"}
INFIX = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
    "gt": ">", "ge": ">=", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "left_shift": "<<",
    "right_shift": ">>",
}
FLOAT_BINARY = {
    "pow": "power({0}, {1})", "atan2": "hl.atan2({0}, {1})", "hypot": "hypot({0}, {1})",  # halide_special.py
    # On the bits: Halide writes -x as 0 - x, which turns copysign(0, -1) into +0 (the fuzzer's
    # atan2(0, copysign(False, -0.5)): eager's pi, smelt's 0).
    "copysign": "hl.reinterpret({t}, (hl.reinterpret(hl.UInt({bits}), {0}) & ~(hl.cast(hl.UInt({bits}), 1) << {shift}))"
                " | (hl.reinterpret(hl.UInt({bits}), {1}) & (hl.cast(hl.UInt({bits}), 1) << {shift})))",
    "fmod": "float_fmod({0}, {1})",  # halide_division.py
    # NaN in either operand wins, as in eager.
    "maximum": "hl.select(hl.is_nan({0}) | ({0} > {1}), {0}, {1})",
    "minimum": "hl.select(hl.is_nan({0}) | ({0} < {1}), {0}, {1})",
    # Approximations for index math: floor_divide and remainder lower through fmod (lowering/division.py).
    "floordiv": "hl.floor({0} / {1})", "remainder": "{0} - hl.floor({0} / {1}) * {1}",
    # One step of the bit pattern toward b: away from zero when b lies beyond a, else toward it;
    # from zero, the smallest subnormal with b's sign.
    "nextafter": "hl.select(hl.is_nan({0}) | hl.is_nan({1}), {0} + {1}, hl.select({0} == {1}, {1}, "
                 "hl.select({0} == 0, hl.select({1} > 0, hl.reinterpret({t}, hl.cast(hl.Int({bits}), 1)), "
                 "-hl.reinterpret({t}, hl.cast(hl.Int({bits}), 1))), hl.reinterpret({t}, "
                 "hl.reinterpret(hl.Int({bits}), {0}) + hl.select(({1} > {0}) == ({0} > 0), "
                 "hl.cast(hl.Int({bits}), 1), hl.cast(hl.Int({bits}), -1))))))",
}
# Integer fmod divides by 1 where the divisor is -1 (the same 0, where INT_MIN % -1 traps the
# CPU's divide: SIGFPE) or 0 (eager raises there; a kernel cannot, and the trap ends the process).
# Halide takes a signed integer overflow as undefined, and its simplifier reasons from that (it
# folded (a + 1) > a to true, and a wrapped product's remainder read the unwrapped value); eager
# wraps. Integer arithmetic that can overflow runs on the operands' unsigned bits, which wrap.
WRAPPING_INT = {"add": "+", "sub": "-", "mul": "*"}


def wrapping_int_text(name: str, a: str, b: str, dtype: torch.dtype) -> str:
    return f"hl.reinterpret({halide_type(dtype)}, {_unsigned_bits(a, dtype)} {WRAPPING_INT[name]} {_unsigned_bits(b, dtype)})"


def wrapping_int_unary_text(name: str, a: str, dtype: torch.dtype) -> str:
    """neg and abs of a signed integer, wrapping at its smallest value as eager's (Halide's simplifier
    takes any signed form of hl.abs, even reinterpreted, as never negative)."""
    bits = dtype.itemsize * 8
    unsigned = _unsigned_bits(a, dtype)
    negated = f"hl.cast(hl.UInt({bits}), 0) - {unsigned}"
    if name == "abs":
        negated = f"hl.select({a} < {literal(0, dtype)}, {negated}, {unsigned})"
    return f"hl.reinterpret({halide_type(dtype)}, {negated})"


def _unsigned_bits(a: str, dtype: torch.dtype) -> str:
    """The bits of signed integer `a` as the unsigned type of its width. Not a reinterpret: Halide's
    simplifier folds reinterpret(u64, cast(i64, f)) into cast(u64, f), undefined for f < 0 (DeBERTa's
    -bucket + 8, of a float's conversion, gave 9 for 10). The sign bit is moved on its own, as in
    HalideOps.to_dtype."""
    bits = dtype.itemsize * 8
    top = 1 << (bits - 1)
    unsigned = torch.uint64 if bits == 64 else torch.uint32 if bits == 32 else None
    high = literal(top, unsigned) if unsigned is not None else f"hl.cast(hl.UInt({bits}), {top})"
    return (f"(hl.cast(hl.UInt({bits}), {a} & {literal(top - 1, dtype)}) | "
            f"hl.select({a} < {literal(0, dtype)}, {high}, hl.cast(hl.UInt({bits}), 0)))")


def shift_text(name: str, a: str, b: str, dtype: torch.dtype) -> str:
    """Eager's shifts: by the width or more, or by a negative count, everything is shifted out (a
    right shift of a negative value leaves -1); a left shift wraps."""
    bits = dtype.itemsize * 8
    t = halide_type(register_dtype(dtype))
    out_of_range = f"({b} >= {literal(bits, dtype)}) | ({b} < {literal(0, dtype)})"
    if name == "left_shift":
        shifted = (f"hl.reinterpret({t}, {_unsigned_bits(a, dtype)} << {_unsigned_bits(b, dtype)})"
                   if dtype.is_signed else f"{a} << {b}")
        return f"hl.select({out_of_range}, {literal(0, dtype)}, {shifted})"
    shifted_out = f"hl.select({a} < {literal(0, dtype)}, {literal(-1, dtype)}, {literal(0, dtype)})" \
        if dtype.is_signed else literal(0, dtype)
    return f"hl.select({out_of_range}, {shifted_out}, {a} >> {b})"


INT_BINARY = {
    "maximum": "hl.max({0}, {1})", "minimum": "hl.min({0}, {1})", "fmod": "hl.mod_round_to_zero({0}, hl.select(({1} == hl.cast({t}, -1)) | ({1} == hl.cast({t}, 0)), "
             "hl.cast({t}, 1), {1}))",
}


def signbit_bits(dtype: torch.dtype) -> dict:
    bits = register_dtype(dtype).itemsize * 8
    return {"bits": bits, "shift": bits - 1}


class HalideIndexPrinter(IndexPrinter):
    """Prints a sympy index expression as Halide int32 arithmetic. Every divisor smelt's index
    math makes is positive, where Halide's `/` and `%` floor exactly as FloorDiv/ModularIndexing do."""

    def __init__(self, names: dict):
        super().__init__()
        self.names = names  # sympy symbol -> text (the kernel's vars, RDom vars, size params)

    def _print_Symbol(self, e):
        return self.names.get(e, e.name)

    def _print_Integer(self, e):
        v = int(e)
        return str(v) if -2 ** 31 <= v < 2 ** 31 else f"hl.i64({v})"

    def _print_Pow(self, e):
        try:
            return super()._print_Pow(e)
        except NotImplementedError:
            raise UnsupportedInHalide(f"smelt: cannot print index power {e} in Halide") from None

    def _print_Max(self, e):
        return functools.reduce(lambda a, b: f"hl.max({a}, {b})", (self._print(a) for a in e.args))

    def _print_Min(self, e):
        return functools.reduce(lambda a, b: f"hl.min({a}, {b})", (self._print(a) for a in e.args))

    def _print_Rational(self, e):
        raise UnsupportedInHalide(f"smelt: fractional index {e} in Halide")

    def emptyPrinter(self, e):
        raise UnsupportedInHalide(f"smelt: cannot print index expression {e} ({type(e).__name__}) in Halide")
