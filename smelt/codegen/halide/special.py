"""Special functions Halide lacks, as Halide Python helpers a generated module defines when used.

erf, erfc, erfinv, i0 and lgamma are computed in float64 and rounded once to the operand's type, so
float32 results carry only the approximation's own error (relative error below 1e-9 for erf and erfc, 4e-7
for erfinv, 2e-7 for i0; lgamma's Lanczos sum is good to about 1e-14). exp_float32 is every float32 kernel's exp.
"""
from __future__ import annotations

# In dependency order: a helper is included when the kernel, or a helper before it, calls it.
SPECIAL_FUNCTIONS = {
    "sigmoid": '''

def sigmoid(v, at):
    # From exp(-|v|) <= 1: no overflow to guard (silu_mul 2048x2048, one thread: 2.19 -> 2.07 ms).
    # `at`: v's pure vars, as exp_float32's.
    if v.type() != hl.Float(32):
        return 1 / (1 + exp(-v))
    small = exp_float32(-hl.abs(v), at, nonpositive=True)
    return hl.select(v >= 0, hl.f32(1), small) / (1 + small)
''',
    "tanh": '''

def tanh(v, at):
    # Halide's tanh is the C library's, called one element at a time (6x eager's time on the CPU:
    # GPT-2's and ALBERT's tanh GELU). On float32: (1 - e) / (1 + e), e = exp(-2|v|), from |v| =
    # 0.625 (e <= 0.29 and its error shrinks in the ratio, taken in float64), below that tanh's
    # Taylor series in float64 to v**23 (relative error 2e-10); each rounded once.
    if v.type() != hl.Float(32):
        return hl.tanh(v)
    z = hl.abs(v)
    e = hl.cast(hl.Float(64), exp_float32(-2 * z, at, nonpositive=True))
    far = hl.select(v < 0, hl.f32(-1), hl.f32(1)) * hl.cast(hl.Float(32), (1 - e) / (1 + e))
    x = hl.cast(hl.Float(64), v)
    near = hl.cast(hl.Float(32), x * horner(TANH_TAYLOR, x * x, at))
    return hl.select(hl.is_nan(v) | (v == 0), v, hl.select(z < hl.f32(0.625), near, far))


TANH_TAYLOR = (
    1.0, -0.3333333333333333, 0.13333333333333333, -0.05396825396825397, 0.021869488536155203,
    -0.008863235529902197, 0.003592128036572481, -0.0014558343870513183, 0.000590027440945586,
    -0.00023912911424355248, 9.691537956929451e-05, -3.927832388331683e-05)
''',
    "exp2": '''

def exp2(v):
    # exp(v * ln 2) rounds v * ln 2 to v's type first: a relative error of |v| * 2**-24 in float32
    # that grows with |v| (exp2(100) was 4 ulps off; eager's exp2 is within one). The product and
    # the exp in float64, rounded once; float64 keeps its own (an error of |v| * 2**-53).
    if v.type() == hl.Float(64):
        return exp(v * hl.f64(0.6931471805599453))
    return hl.cast(v.type(), exp(hl.cast(hl.Float(64), v) * hl.f64(0.6931471805599453)))
''',
    "exp_float32": '''

# exp on float32, the one exp every float32 kernel uses, so that a value one kernel stores and
# another recomputes (a softmax's exp(v - max) and a later exp of the same difference) has the
# same bits: an eq on them (amax's backward) then finds its element. exp(v) = 2**k * exp(f),
# k = round(v / ln 2), f = v - k ln 2 (ln 2 in two parts, so k ln 2 is exact), and
# exp(f) = 1 + f + f**2 q(f), q's Taylor terms to f**6 (under 4e-9 of q on |f| <= 0.35). The
# sum 1 + f is split into its rounded value and its exact error (Fast2Sum: |f| < 1), which joins
# f**2 q before the one last rounding: within 0.51 ulp. (A plain degree-6 Horner, within 1.1e-7,
# left efficientnet's training gradients 3.8x eager's error in the model suite; the sum in
# float64 was as exact but 1.75x slower.) Below -87.33 (k < -126) the result is subnormal, as
# eager's (a log of a softmax over logits 88 apart was -inf); below -103.98 it is 0. Above
# 88.7228 it overflows to inf, as eager's.
EXP_Q_DEGREE = 6


def exp_float32(v, at, nonpositive=False):
    # `at`: the pure vars v is a function of, (r, x), (x,) or (). Over vars, the polynomial is a
    # Func of its own: a leaf to the tree walks of is_nan and strict_float in its callers.
    # (Kernels compile with StrictFloat, so it has no fused multiply-adds and the error term of
    # 1 + f is kept; compiling it without them lost NaN through a select in Halide 21.)
    # `nonpositive`: the caller knows v <= 0 or nan (a softmax's v - max): the upper clamp is left
    # out, with the same bits for every such v.
    # The clamps are comparisons, not min and max (which drop a NaN on x86): a NaN v stays NaN
    # through inside, f and p, and so in the result, without a select of its own at the end
    # (that select, on v kept live across the polynomial, cost 0.2 ns an element: exp(a) * b over
    # 352K float32, one thread, 215 -> 135 us with the guards below).
    inside = hl.select(v < hl.f32(-104.0), hl.f32(-104.0), v)  # exp(-104) rounds to 0
    if not nonpositive:
        inside = hl.select(v > hl.f32(88.75), hl.f32(88.75), inside)  # exp(88.75) overflows
    whole = hl.floor(inside * hl.f32(1.4426950408889634) + hl.f32(0.5))  # k, the nearest integer
    k = hl.cast(hl.Int(32), whole)
    f = hl.strict_float((inside - whole * hl.f32(0.693145751953125)) - whole * hl.f32(1.428606765330187e-06))
    factorial = [2.0]
    for n in range(3, EXP_Q_DEGREE + 3):
        factorial.append(factorial[-1] * n)
    q = hl.f32(1 / factorial[-1])
    for term in factorial[-2::-1]:
        q = q * f + hl.f32(1 / term)
    head = hl.f32(1.0) + f
    error = (hl.f32(1.0) - head) + f  # exact: what rounding 1 + f dropped
    p = head + (error + f * f * q)
    if at:
        polynomial = hl.Func("exp_polynomial")
        polynomial[at] = p
        p = polynomial[at]
    # 2**k as 2**half * 2**(k - half), both normal for k in [-150, 128]: the first product is exact
    # and the second rounds once, into the subnormals, to 0 or to inf where the value goes there.
    half = k >> 1
    return (p * hl.reinterpret(hl.Float(32), (half + 127) << 23)) * hl.reinterpret(hl.Float(32), (k - half + 127) << 23)
''',
    "sin_float32": '''

def sin_float32(v):
    # Halide's sin and cos are the C library's, called one element at a time: 18x eager's time
    # (1M float32, 2 cores: 4.9 ms against 271 us), paid by every Llama's rotary tables each call.
    quadrant, sin_r, cos_r = quarter_turns(v)
    value = hl.select(quadrant == 0, sin_r, hl.select(quadrant == 1, cos_r, hl.select(quadrant == 2, -sin_r, -cos_r)))
    return hl.select(v == 0, v, hl.cast(hl.Float(32), value))  # the sine of -0 is -0
''',
    "cos_float32": '''

def cos_float32(v):
    quadrant, sin_r, cos_r = quarter_turns(v)
    value = hl.select(quadrant == 0, cos_r, hl.select(quadrant == 1, -sin_r, hl.select(quadrant == 2, -cos_r, sin_r)))
    return hl.cast(hl.Float(32), value)
''',
    "quarter_turns": '''

# float32 v = (n + f) quarter turns, n an integer, |f| <= 1/2, from 2/pi in 5 chunks of 28 bits and
# a tail: each v * chunk is exact in float64 (24 + 28 bits) and is reduced mod 4 exactly, to
# [-2, 2] (a small product stays as it is), so the reduction is exact for every float32 (Payne and
# Hanek's, without a table); v * tail is under 4e-5 for every float32, rounded once. f is summed
# from the largest term down once n is taken out, so an argument near a multiple of pi/2 keeps its
# digits. sin and cos of r = f * pi/2 by their Taylor series in float64 (to r**13 and r**14: under
# 3e-14 on |r| <= pi/4), for the caller to round once.
TWO_OVER_PI_CHUNKS = (0.6366197690367699, 3.3308114738561656e-09, 2.276010047810136e-18, 2.5268260189002822e-26,
                      1.6682867657019525e-34)
TWO_OVER_PI_TAIL = 1.1588713353428143e-43
SIN_TAYLOR = (1.0, -1 / 6, 1 / 120, -1 / 5040, 1 / 362880, -1 / 39916800, 1 / 6227020800)
COS_TAYLOR = (1.0, -1 / 2, 1 / 24, -1 / 720, 1 / 40320, -1 / 3628800, 1 / 479001600, -1 / 87178291200)


def quarter_turns(v):
    """(n mod 4 as int32, the sine of r, its cosine) for float32 v = n quarter turns + r radians."""
    x = hl.cast(hl.Float(64), v)
    turns = []
    for chunk in TWO_OVER_PI_CHUNKS:
        p = x * hl.f64(chunk)
        turns.append(p - hl.f64(4) * hl.round(p * hl.f64(0.25)))  # exact: p mod 4, in [-2, 2]
    turns.append(x * hl.f64(TWO_OVER_PI_TAIL))
    n = hl.round(sum(turns[1:], turns[0]))
    f = turns[0] - n
    for t in turns[1:]:
        f = f + t
    r = f * hl.f64(1.5707963267948966)
    r2 = r * r
    sin_r, cos_r = hl.f64(SIN_TAYLOR[-1]), hl.f64(COS_TAYLOR[-1])
    for c in SIN_TAYLOR[-2::-1]:
        sin_r = sin_r * r2 + hl.f64(c)
    for c in COS_TAYLOR[-2::-1]:
        cos_r = cos_r * r2 + hl.f64(c)
    return hl.cast(hl.Int(32), n) & 3, sin_r * r, cos_r
''',
    "sinh_float32": '''

def sinh_float32(v):
    # Halide's sinh and cosh are the C library's, called one element at a time (sinh: 12 ns an element on
    # the CPU against eager's 0.7). In float64, rounded once: (e - 1/e) / 2 with e = exp(|x|) from
    # |x| = 0.5; below, sinh's Taylor series to x**13.
    x = hl.cast(hl.Float(64), v)
    e = exp_float64(hl.abs(x))
    far = hl.select(x < 0, hl.f64(-0.5), hl.f64(0.5)) * (e - 1 / e)
    x2 = x * x
    near = hl.f64(1 / 6227020800)
    for c in (1 / 39916800, 1 / 362880, 1 / 5040, 1 / 120, 1 / 6, 1.0):
        near = near * x2 + hl.f64(c)
    value = hl.select(hl.abs(x) < 0.5, x * near, far)
    return hl.select(hl.is_nan(v), v, hl.cast(hl.Float(32), value))
''',
    "cosh_float32": '''

def cosh_float32(v):
    x = hl.cast(hl.Float(64), v)
    e = exp_float64(hl.abs(x))
    return hl.select(hl.is_nan(v), v, hl.cast(hl.Float(32), hl.f64(0.5) * (e + 1 / e)))
''',
    "exp_float64": '''

# exp on float64 for the float32 helpers above (Halide's float64 exp is the C library's): x = k ln 2 + r,
# ln 2 in two parts (k ln 2 exact for |k| < 2**20), exp(r) by its Taylor series to r**12 on |r| <= 0.35
# (the next term under 2e-16), times 2**k built from its bits. Arguments are clamped to
# [-745, 709]: the float32 callers round anything past 89.5 to inf or 0 anyway.
def exp_float64(x):
    clamped = hl.clamp(x, hl.f64(-745.0), hl.f64(709.0))
    k = hl.round(clamped * hl.f64(1.4426950408889634))
    r = (clamped - k * hl.f64(0.6931471803691238)) - k * hl.f64(1.9082149292705877e-10)
    p = hl.f64(1 / 479001600)
    for c in (1 / 39916800, 1 / 3628800, 1 / 362880, 1 / 40320, 1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0):
        p = p * r + hl.f64(c)
    half = hl.cast(hl.Int(64), k) // 2  # 2**k as 2**half * 2**(k - half): each stays a normal float64
    scale_a = hl.reinterpret(hl.Float(64), (half + 1023) << 52)
    scale_b = hl.reinterpret(hl.Float(64), (hl.cast(hl.Int(64), k) - half + 1023) << 52)
    return p * scale_a * scale_b
''',
    "erf": '''

def erf(v, at):
    # Halide's hl.erf is a few float32 ulps off (5x eager's error over 16 elements, fuzz #18).
    # (float64 tensors: erf and erfc are not printed, halide_ops.FLOAT64_UNPRINTED.)
    x = hl.clamp(hl.cast(hl.Float(64), v), hl.f64(-3.92), hl.f64(3.92))  # erf(3.92) is 1 in float32
    z = hl.abs(x)
    near = x * horner(ERF_NEAR_ZERO, x * x, at)
    far = hl.select(x < 0, hl.f64(-1), hl.f64(1)) * (1 - horner(ERFC_TAIL, (z - hl.f64(1.5)) * hl.f64(2 / 2.42) - 1, at))
    result = pick(z < hl.f64(1.5), near, far)
    return hl.select(hl.is_nan(v) | (v == 0), v, hl.cast(v.type(), result))  # erf(-0.0) = -0.0
''',
    "erfc": '''

def erfc(v, at):
    # 1 - erf(v) while erfc(v) > 0.03 (|v| < 1.5); past that exp(-z * z) times a fit of
    # erfc(z) * exp(z * z), so the tail keeps its digits down to float32's subnormals
    # (erfc(10) = 2e-45; the 1 - erf of Halide's polynomial gave erfc(5) = 0).
    x = hl.cast(hl.Float(64), v)
    z = hl.min(hl.abs(x), hl.f64(30))  # erfc(30) is 0 in float64; z * z stays finite
    near = 1 - hl.min(z, hl.f64(1.5)) * horner(ERF_NEAR_ZERO, hl.min(z * z, hl.f64(2.25)), at)
    far = hl.exp(-(z * z)) * horner(ERFC_SCALED, hl.f64(1.5) / hl.max(z, hl.f64(1.5)), at)
    positive = pick(z < hl.f64(1.5), near, far)
    result = hl.select(x >= 0, hl.f64(1), hl.f64(-1)) * positive + hl.select(x >= 0, hl.f64(0), hl.f64(2))
    return hl.select(hl.is_nan(v), v, hl.cast(v.type(), result))
''',
    "pick": '''

def pick(condition, a, b):
    # select(condition, a, b) for two large float64 polynomials, as arithmetic: Halide's simplifier
    # took minutes over a select between them (exponential in their degree); both are finite.
    w = hl.select(condition, hl.f64(1), hl.f64(0))
    return w * a + (1 - w) * b
''',
    "horner": '''

def horner(coefficients, t, at):
    # `at` as exp_float32's: over pure vars the polynomial is a Func of its own.
    p = hl.f64(coefficients[-1])
    for c in coefficients[-2::-1]:
        p = p * t + hl.f64(c)
    if not at:
        return p
    polynomial = hl.Func("polynomial")
    polynomial[at] = p
    return polynomial[at]


# Least-squares fits on Chebyshev nodes against mpmath (600-800 nodes), in float64, so float32
# results are rounded once (within 0.503 ulp of erf and 0.51 of erfc over [-12, 12]):
# erf(x) / x in x * x on [0, 1.5 ** 2], degree 9 (relative error 5e-11);
ERF_NEAR_ZERO = (
    1.128379167059266, -0.37612638577726254, 0.11283786837958032, -0.026865891370578814,
    0.00522315432294394, -0.0008534288947584642, 0.00011907968704237037, -1.3949194593425752e-05,
    1.2397348384406796e-06, -6.098000881285172e-08)
# erfc(x) in u = (x - 1.5) / 1.21 - 1 on [1.5, 3.92], degree 14 (absolute error 3e-10);
ERFC_TAIL = (
    0.00012683798752986895, -0.0008825449652504628, 0.002893955232366059, -0.005895795131472353,
    0.008254083462234956, -0.008235412381088521, 0.005778992114829506, -0.00254987463300829,
    0.0002775959447389104, 0.000539291089614773, -0.0004274782526154618, 0.00010526602323792495,
    3.9929528324424076e-05, -2.8342166923074925e-05, 3.5256085529562268e-06)
# erfc(z) * exp(z * z) in 1.5 / z on (0, 1], degree 16 (relative error 4e-11 up to z = 30).
ERFC_SCALED = (
    -1.431355034497983e-13, 0.3761263895185298, -5.653141674916151e-08, -0.08358127096557608,
    -5.097091183326255e-05, 0.0563790813453427, -0.005525771995590803, -0.02997981748235437,
    -0.13006948163672716, 0.47101091303269516, -0.7424444597794708, 0.7244325497750268,
    -0.46741741577991064, 0.19556469408906127, -0.04797090818954173, 0.005012459919710576,
    9.948204708537162e-05)
''',
    "power": '''

def power(a, b):
    # C's pow: |a| ** b as exp(b * log|a|) in float64 (Halide's pow misses the special values and
    # overflows as its exp does: 2 ** 1e10 = 0), the sign of a negative base to an odd power, nan
    # for a negative base to a non-integer power, and 1 for a ** 0, 1 ** b and (-1) ** inf.
    wide = hl.Float(64)
    x, y = hl.cast(wide, a), hl.cast(wide, b)
    magnitude = exp(y * log(hl.abs(x)))
    integer = hl.floor(y) == y
    odd = integer & (hl.floor(y * hl.f64(0.5)) != y * hl.f64(0.5))
    negative = (hl.reinterpret(hl.UInt(64), x) >> 63) != 0  # -0 too
    one = (y == 0) | (x == 1) | ((hl.abs(x) == 1) & hl.is_inf(y))
    result = hl.select(negative & odd, -magnitude, magnitude)
    result = hl.select((x < 0) & hl.is_finite(x) & ~integer & hl.is_finite(y), hl.f64(float("nan")), result)
    return hl.cast(a.type(), hl.select(one, hl.f64(1), result))
''',
    "hypot": '''

def hypot(a, b):
    # sqrt(a * a + b * b) overflows from 1.8e19 in float32: the larger magnitude times
    # sqrt(1 + ratio ** 2) does not. An infinity wins over nan, as in C.
    big, small = hl.max(hl.abs(a), hl.abs(b)), hl.min(hl.abs(a), hl.abs(b))
    ratio = small / big
    result = hl.select(big == 0, big, big * hl.sqrt(1 + ratio * ratio))
    result = hl.select(hl.is_nan(a) | hl.is_nan(b), a + b, result)
    return hl.select(hl.is_inf(a) | hl.is_inf(b), hl.cast(a.type(), float("inf")), result)
''',
    "erfinv": '''

def erfinv(v):
    # Giles, "Approximating the erfinv function" (GPU Computing Gems, 2010), single-precision form.
    x = hl.cast(hl.Float(64), v)
    w = -hl.log((1 - x) * (1 + x))
    central, tail = w - 2.5, hl.sqrt(w) - 3
    p = hl.f64(2.81022636e-08)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p = hl.f64(c) + p * central
    q = hl.f64(-0.000200214257)
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        q = hl.f64(c) + q * tail
    inf = hl.f64(float("inf"))
    result = hl.select(hl.abs(x) == 1, hl.select(x > 0, inf, -inf), hl.select(w < 5, p, q) * x)
    return hl.cast(v.type(), hl.select(hl.abs(x) > 1, hl.f64(float("nan")), result))
''',
    "i0": '''

def i0(v):
    # Abramowitz and Stegun 9.8.1 and 9.8.2: a polynomial in (x / 3.75)^2 below 3.75, an
    # asymptotic series in 3.75 / x above it.
    x = hl.abs(hl.cast(hl.Float(64), v))
    t = x / 3.75
    small = hl.f64(0.0045813)
    for c in (0.0360768, 0.2659732, 1.2067492, 3.0899424, 3.5156229, 1.0):
        small = hl.f64(c) + small * t * t
    u = 3.75 / x
    large = hl.f64(0.00392377)
    for c in (-0.01647633, 0.02635537, -0.02057706, 0.00916281, -0.00157565, 0.00225319, 0.01328592, 0.39894228):
        large = hl.f64(c) + large * u
    large = large * hl.exp(x) / hl.sqrt(x)
    return hl.cast(v.type(), hl.select(hl.is_nan(x), x, hl.select(x < 3.75, small, large)))
''',
    "lgamma": '''

def lgamma(v):
    # log|gamma(x)|: the Lanczos sum (g = 7, 9 terms) for x >= 0.5, reflection below it.
    x = hl.cast(hl.Float(64), v)
    z = hl.select(x < 0.5, 1 - x, x) - 1
    coefficients = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
                    -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
                    1.5056327351493116e-7)
    total = hl.f64(coefficients[0])
    for k, c in enumerate(coefficients[1:], start=1):
        total = total + hl.f64(c) / (z + k)
    t = z + 7.5
    log_gamma = hl.f64(0.91893853320467274) + (z + 0.5) * hl.log(t) - t + hl.log(total)
    pi = hl.f64(3.141592653589793)  # a bare Python float would be read as float32
    # |sin(pi x)| from x's distance to the nearest integer: the sine of a small argument stays exact.
    reflected = hl.log(pi / hl.abs(hl.sin(pi * (x - hl.round(x))))) - log_gamma
    whole = (x <= 0) & (hl.floor(x) == x)  # a pole of gamma
    result = hl.select(whole, hl.f64(float("inf")), hl.select(x < 0.5, reflected, log_gamma))
    result = hl.select(hl.is_inf(x), hl.f64(float("inf")), result)
    return hl.cast(v.type(), hl.select(hl.is_nan(x), x, result))
''',
}
