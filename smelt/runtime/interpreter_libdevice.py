"""Stand-ins for libdevice under the Triton interpreter, which cannot call libdevice.

CPU graphs run Triton kernels through the interpreter; their kernels import this module in place
of `triton.language.extra.libdevice`. Each function is built from `tl` primitives the interpreter
supports. They are for exercising codegen on the CPU, not for speed or last-ulp accuracy.
"""
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction as _interpreted


@_interpreted
def tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@_interpreted
def expm1(x):
    # exp(x) - 1 loses every digit for tiny x; the series is exact enough there.
    return tl.where(tl.abs(x) < 1e-5, x + 0.5 * x * x, tl.exp(x) - 1.0)


@_interpreted
def log1p(x):
    return tl.where(tl.abs(x) < 1e-5, x - 0.5 * x * x, tl.log(1.0 + x))


@_interpreted
def log10(x):
    return tl.log(x) * 0.4342944819032518


@_interpreted
def sinh(x):
    return 0.5 * (tl.exp(x) - tl.exp(-x))


@_interpreted
def cosh(x):
    return 0.5 * (tl.exp(x) + tl.exp(-x))


@_interpreted
def tan(x):
    return tl.sin(x) / tl.cos(x)


@_interpreted
def asinh(x):
    return tl.where(x < 0, -1.0, 1.0) * tl.log(tl.abs(x) + tl.sqrt(x * x + 1.0))


@_interpreted
def acosh(x):
    return tl.log(x + tl.sqrt(x * x - 1.0))


@_interpreted
def atanh(x):
    return 0.5 * tl.log((1.0 + x) / (1.0 - x))


@_interpreted
def erfc(x):
    return 1.0 - tl.erf(x)


@_interpreted
def trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@_interpreted
def nearbyint(x):
    # Round half to even, as torch.round does.
    floor = tl.floor(x)
    diff = x - floor
    even = tl.floor(floor * 0.5) * 2.0 == floor
    up = (diff > 0.5) | ((diff == 0.5) & ~even)
    return tl.where(up, floor + 1.0, floor)


@_interpreted
def pow(x, y):
    y = x * 0.0 + y  # a literal exponent becomes a tensor like x
    magnitude = tl.exp(y * tl.log(tl.abs(x)))
    y_int = tl.floor(y) == y
    odd = y_int & (tl.floor(y * 0.5) * 2.0 != y)
    signed = tl.where((x < 0) & odd, -magnitude, magnitude)
    result = tl.where((x < 0) & ~y_int, float("nan"), signed)
    return tl.where(y == 0, 1.0, tl.where((x == 0) & (y > 0), 0.0, result))


@_interpreted
def fmod(x, y):
    q = x / y
    return x - tl.where(q < 0, tl.ceil(q), tl.floor(q)) * y


@_interpreted
def copysign(x, y):
    return tl.where(y < 0, -tl.abs(x), tl.abs(x))


@_interpreted
def hypot(x, y):
    return tl.sqrt(x * x + y * y)


@_interpreted
def nextafter(x, y):
    # Adding one to the integer holding a float's bits moves it one step away from zero.
    x, y = tl.broadcast(x, y)
    int_type = tl.int64 if x.dtype == tl.float64 else tl.int32
    bits = x.to(int_type, bitcast=True)
    away = (y > x) == (x > 0)
    stepped = tl.where(away, bits + 1, bits - 1).to(x.dtype, bitcast=True)
    tiniest = (bits * 0 + 1).to(x.dtype, bitcast=True)  # the smallest subnormal
    result = tl.where(x == 0, tl.where(y > 0, tiniest, -tiniest), stepped)
    result = tl.where(x == y, y, result)
    return tl.where((x != x) | (y != y), x + y, result)


@_interpreted
def signbit(x):
    return x < 0
