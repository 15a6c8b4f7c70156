"""Halide helpers for division with rounding on floats (a generated module defines one when used)."""
from __future__ import annotations

DIVISION_HELPERS = {
    "float_fmod": '''

def float_fmod(a, b):
    # C's fmod, exact, for float32 and narrower operands: in float64, r - trunc(r / d) * d is exact
    # while r / d < 2**29 (the product then fits 53 bits), so r is reduced by d = b * 2**(28 j)
    # for j from 10 down to 0 (b * 2**308 covers float32's range; an exact power-of-two scaling).
    # A zero result takes a's sign, a finite a over an infinite b is a, and a zero b gives nan
    # (the division never sees a zero: Halide rejects a literal one).
    wide = hl.Float(64)
    x, y = hl.cast(wide, a), hl.cast(wide, b)
    divisor = hl.abs(hl.select(y == 0, hl.f64(1), y))
    r = hl.abs(x)
    for j in range(10, -1, -1):
        d = divisor * hl.f64(2.0 ** (28 * j))
        r = r - hl.trunc(r / d) * d
    r = hl.select(x < 0, -r, r)
    # x's sign bit alone (Halide's simplifier folds a constant times 0, and a select between
    # -0.0 and 0.0, to +0).
    signed_zero = hl.reinterpret(wide, hl.reinterpret(hl.UInt(64), x) & hl.u64(1 << 63))
    r = hl.select(r == 0, signed_zero, r)
    r = hl.select(hl.is_inf(y) & hl.is_finite(x), x, r)
    return hl.cast(a.type(), hl.select(y == 0, hl.f64(float("nan")), r))
''',
}
