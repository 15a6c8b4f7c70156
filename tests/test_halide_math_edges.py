"""Float math at special and extreme inputs, and reductions over rows of one element (or none),
against eager, on the CPU backend under test (Halide by default; SMELT_CPU_BACKEND=triton runs
the same cases through Triton's interpreter).

An element passes when it is eager's value (NaN where eager has NaN, the same infinity, finite
values within a tight relative tolerance), or the float64 run's value rounded to the dtype, or
closer to that float64 value than eager's: eager itself is off at a few of these inputs (its
vectorized sinh overflows at 89 where the scalar path gives 2.2e38; its erf GELU at -5 is 20%
off in float32). Values within the dtype's smallest normal of each other count as equal (a
subnormal flushed to 0), and so do two values both below it times |x| (up to 128): a flushed
subnormal that a later op scales by x (silu(-88) = -88 * sigmoid(-88), whose fast exp flushes
results below 2**-126 by design: halide_special.exp_float32).
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F

SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1e-30, -1e-30, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 5.0, -5.0,
           9.0, -9.0, 10.0, -10.0, 20.0, -20.0, 88.0, -88.0, 89.0, -89.0, 100.0, -100.0, 1e4, -1e4, 1e9, -1e9,
           1e10, -1e10, 1e30, -1e30, 3e38, -3e38, math.inf, -math.inf, math.nan]

# Every float op the pointwise lowerings print one by one (smelt/lowering/pointwise.py's table),
# then the activations and compositions built from them.
UNARY = {name: getattr(torch, name) for name in (
    "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh asinh acosh "
    "atanh erf erfc erfinv sigmoid reciprocal floor ceil trunc round abs neg sign lgamma relu square frac "
    "deg2rad nan_to_num sgn isnan isinf signbit logit sinc").split()}
UNARY.update({
    "i0": torch.special.i0, "ndtr": torch.special.ndtr, "log_ndtr": torch.special.log_ndtr,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "softplus": F.softplus, "softplus_beta2": lambda x: F.softplus(x, beta=2.0),
    "softplus_threshold100": lambda x: F.softplus(x, beta=1, threshold=100),
    "elu": F.elu, "selu": F.selu, "celu": lambda x: F.celu(x, alpha=0.5), "log_sigmoid": F.logsigmoid,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "hardtanh": F.hardtanh, "leaky_relu": F.leaky_relu,
    "tanhshrink": F.tanhshrink, "softsign": F.softsign,
    "pow_2.5": lambda x: x ** 2.5, "pow_-1.5": lambda x: torch.pow(x, -1.5), "pow_0.3": lambda x: x ** 0.3,
    "pow_-2": lambda x: x ** -2.0, "pow_of_2": lambda x: torch.pow(2.0, x), "pow_of_0.5": lambda x: torch.pow(0.5, x),
    "pow_of_10": lambda x: torch.pow(10.0, x), "pow_self": lambda x: torch.pow(x, x),
    "xlogy": lambda x: torch.xlogy(x, x), "ldexp_3": lambda x: torch.ldexp(x, torch.tensor(3)),
    "atan2_1": lambda x: torch.atan2(x, torch.ones_like(x)), "hypot_1": lambda x: torch.hypot(x, torch.ones_like(x)),
    "fmod_3": lambda x: torch.fmod(x, 3.0), "remainder_3": lambda x: torch.remainder(x, 3.0),
    "sigmoid_of_exp": lambda x: torch.sigmoid(torch.exp(-x)), "exp_minus_max": lambda x: torch.exp(x - 3e38),
})

TOLERANCE = {torch.float32: 4e-6, torch.bfloat16: 8e-3}


def mismatches(x, actual, fn, rtol):
    """(input, compiled, eager, float64) for each element that fails the rule in the docstring."""
    expected = fn(x.clone())
    reference = fn(x.clone().double()).to(x.dtype)
    tiny = torch.finfo(x.dtype).tiny

    def same(a, b, v):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        scaled_tiny = tiny * min(max(1.0, abs(v)), 128.0)
        return abs(a - b) <= rtol * abs(b) + tiny or max(abs(a), abs(b)) <= scaled_tiny

    bad = []
    for v, a, e, r in zip(x.tolist(), actual.double().tolist(), expected.double().tolist(), reference.double().tolist()):
        closer = all(map(math.isfinite, (a, e, r))) and abs(a - r) <= abs(e - r)
        if not (same(a, e, v) or same(a, r, v) or closer):
            bad.append((v, a, e, r))
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float_op_at_special_and_extreme_inputs(name, dtype, compile_fn):
    fn = UNARY[name]
    if dtype == torch.bfloat16 and name == "log_ndtr":
        pytest.skip("eager has no bfloat16 log_ndtr")
    x = torch.tensor(SPECIAL, dtype=dtype)
    if dtype == torch.bfloat16 and os.environ.get("SMELT_CPU_BACKEND") in ("triton", "reference"):
        # Found here, not fixed: under Triton's interpreter bfloat16 subnormal inputs read as 0
        # (sign(9e-41) = 0, log(9e-41) = -inf), and numpy's float32 sinh/cosh overflow at 89, as
        # torch's vectorized float32 ones do (the reference backend's; eager's bfloat16 path does not).
        keep = (x.abs() >= torch.finfo(dtype).tiny) | (x == 0) | ~x.isfinite()
        x = x[keep & (x.abs() != 89)]
    actual = compile_fn(fn)(x.clone())
    if actual.dtype == torch.bool:
        assert torch.equal(actual, fn(x)), name
        return
    bad = mismatches(x, actual, fn, TOLERANCE[dtype])
    assert not bad, f"{name} ({dtype}): " + "; ".join(
        f"at {v:g}: {a:.7g}, eager {e:.7g}, float64 {r:.7g}" for v, a, e, r in bad)


# ---------------------------------------------------------------- softmax and reductions at the edges

ROW_REDUCTIONS = {
    "softmax": lambda a: torch.softmax(a, -1), "log_softmax": lambda a: torch.log_softmax(a, -1),
    "amax": lambda a: a.amax(-1), "amin": lambda a: a.amin(-1), "sum": lambda a: a.sum(-1),
    "mean": lambda a: a.mean(-1), "prod": lambda a: a.prod(-1), "var": lambda a: a.var(-1),
    "std": lambda a: a.std(-1), "var_correction_2.5": lambda a: a.var(-1, correction=2.5), "var_mean": lambda a: torch.var_mean(a, -1, correction=0),
    "argmax": lambda a: a.argmax(-1), "argmin": lambda a: a.argmin(-1), "cumsum": lambda a: a.cumsum(-1),
    "logsumexp": lambda a: a.logsumexp(-1), "softmax_of_scaled": lambda a: torch.softmax(a * 0.5 + 1, -1),
}
NEEDS_ELEMENTS = {"amax", "amin", "argmax", "argmin"}  # eager refuses an empty row


@pytest.mark.parametrize("name", sorted(ROW_REDUCTIONS))
@pytest.mark.parametrize("rows,length", [(4, 1), (1, 1), (3, 0)])
def test_reduction_over_rows_of_one_element_or_none(name, rows, length, check):
    if length == 0 and name in NEEDS_ELEMENTS:
        pytest.skip("eager raises on an empty row")
    check(ROW_REDUCTIONS[name], torch.randn(rows, length))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "amax", "sum", "var_mean", "argmax", "cumsum"])
def test_dynamic_reduction_whose_row_becomes_one_element(name, compile_fn, assert_close):
    fn = ROW_REDUCTIONS[name]
    compiled = compile_fn(fn, dynamic=True)
    for rows, length in [(3, 7), (5, 1), (2, 9), (6, 1)]:
        x = torch.randn(rows, length)
        assert_close(compiled(x), fn(x))


def test_attention_decode_step_over_one_key(compile_fn, assert_close):
    def attention(q, k, v):
        scores = q @ k.transpose(-1, -2) / 8.0
        return torch.softmax(scores, -1) @ v

    compiled = compile_fn(attention, dynamic=True)
    for keys in (5, 1):
        q, k, v = torch.randn(2, 4, 1, 64), torch.randn(2, 4, keys, 64), torch.randn(2, 4, keys, 64)
        assert_close(compiled(q, k, v), attention(q, k, v))


def test_softmax_over_rows_of_extreme_values(check):
    big = [0.0, 1e10, -1e10, 3e38, -3e38, 88.0, -104.0]
    x = torch.tensor([big, [-math.inf] * 6 + [0.0], [math.inf, 0, 1, 2, 3, 4, 5], [math.nan] + big[1:],
                      [1e-45, -1e-45, 0.0, -0.0, 1e-30, 1.0, -1.0], [-1e30, -1e30, -1e30, -1e30, -1e30, -1e30, -1e30]])
    check(lambda a: (torch.softmax(a, -1), torch.log_softmax(a, -1), a.logsumexp(-1)), x)


def test_exp_keeps_float32_subnormals(compile_fn):
    # Halide's float32 exp was 0 below -87.33, where eager's is subnormal down to -103.97: the log of
    # a softmax over logits 88 apart was -inf. Within one subnormal step of eager's.
    x = torch.cat([torch.linspace(-106, -86, 4001), torch.tensor([-103.97, -103.98, -1e30, -math.inf])])
    actual, expected = compile_fn(torch.exp)(x), torch.exp(x)
    steps = (actual.view(torch.int32).long() - expected.view(torch.int32).long()).abs()
    assert steps.max() <= 1, x[steps.argmax()]
    pair = torch.tensor([[0.0, -90.0], [0.0, -100.0]])
    log_softmax = compile_fn(lambda a: torch.log(torch.softmax(a, -1)))(pair)
    torch.testing.assert_close(log_softmax, torch.log(torch.softmax(pair, -1)), rtol=1e-4, atol=0)


def test_erfc_keeps_its_tail_down_to_float32_subnormals(compile_fn):
    # erfc was 1 - erf: 0 from about 4. Eager's float32 erfc stays positive up to about 10.
    x = torch.linspace(-3, 10, 2601)
    actual, expected = compile_fn(torch.erfc)(x), torch.erfc(x)
    normal = expected >= torch.finfo(torch.float32).tiny
    torch.testing.assert_close(actual[normal], expected[normal], rtol=1e-6, atol=0)
    assert (actual[~normal] - expected[~normal]).abs().max() <= torch.finfo(torch.float32).tiny


@pytest.mark.parametrize("fn", [torch.erf, torch.erfc], ids=["erf", "erfc"])
def test_erf_family_is_rounded_once_from_float64(compile_fn, fn):
    # Halide's erf polynomial was a few ulps off: 5x eager's error over 16 elements (fuzzer #18).
    # smelt's fits are computed in float64 and rounded once: within 0.52 ulp of the float64 value
    # (eager's erf is within 1 ulp, as the Triton interpreter's numpy), signed zeros kept.
    x = torch.cat([torch.linspace(-12, 12, 48001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-40])])
    actual, reference = compile_fn(fn)(x), fn(x.double())
    rounded = reference.float()
    ulp = (torch.nextafter(rounded.abs(), torch.tensor(math.inf)) - rounded.abs()).double()
    ulps = (actual.double() - reference).abs() / ulp
    bound = 1.0 if os.environ.get("SMELT_CPU_BACKEND") in ("triton", "reference") else 0.52  # eager's own erf there
    assert ulps.max() <= bound, (x[ulps.argmax()], actual[ulps.argmax()], reference[ulps.argmax()])
    assert torch.equal(actual.signbit(), rounded.signbit())


def test_tanh_is_within_one_ulp_of_float64(compile_fn):
    # Halide's tanh is the C library's, one element at a time (6x eager's time); smelt's float32
    # tanh (halide/special.py) is exp-based past 0.625 and a float64 series below: within 0.85 ulp.
    x = torch.cat([torch.linspace(-12, 12, 48001), torch.linspace(0.6, 0.65, 5001), torch.linspace(-1e-3, 1e-3, 2001),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-40, 44.0, -88.0])])
    actual, reference = compile_fn(torch.tanh)(x), torch.tanh(x.double())
    rounded = reference.float()
    ulp = (torch.nextafter(rounded.abs(), torch.tensor(math.inf)) - rounded.abs()).double()
    ulps = (actual.double() - reference).abs() / ulp
    assert ulps.max() <= 1.0, (x[ulps.argmax()], actual[ulps.argmax()], reference[ulps.argmax()])
    assert torch.equal(actual.signbit(), rounded.signbit())


def test_float64_logs_of_subnormals(device, compile_fn, assert_close):
    x = torch.tensor([1e-310, 4.9e-324, 2.2e-308, 1e-300, 0.5, 3.0, 0.0, float("inf")], dtype=torch.float64,
                     device=device)
    for f in (torch.log, torch.log2, torch.log10, torch.log1p):
        torch._dynamo.reset()
        assert_close(compile_fn(f)(x), f(x), atol=1e-12, rtol=1e-13)


def test_softmax_over_one_element_of_a_gathered_value(device, compile_fn, assert_close):
    """A row of one element read through an index (found by the fuzzer): the softmax's stored exp is
    a function of (r, x), and the output over x alone must read it at r = 0."""
    def f(x, i):
        return torch.softmax(torch.index_select(x, 0, i), 0, dtype=torch.float32), torch.softmax(x[i] * 2, -1)

    x = torch.randn(1, device=device)
    i = torch.zeros(1, dtype=torch.long, device=device)
    assert_close(compile_fn(f)(x, i), f(x, i))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_comparisons_with_nan_are_false_as_in_eager(dtype, check):
    # Halide has no <= node: it builds a <= b as !(b < a), true where either side is nan. A var of
    # an empty row (nan) compared with itself was True where eager's is False (CPU fuzz, seed 1402).
    nan = float("nan")
    x = torch.tensor([1.0, nan, 2.0, nan, -0.0, float("inf")], dtype=dtype)
    y = torch.tensor([1.0, 1.0, nan, nan, 0.0, float("inf")], dtype=dtype)
    check(lambda x, y: (x <= y, x >= y, x < y, x > y, x == y, x != y, x <= 1.5, x >= 1.5, x <= x,
                        torch.le(x.var(0, keepdim=True), 0.0)), x, y)
    check(lambda x: x[:0].var(0, correction=0) <= x[:0].var(0, correction=0), x)


@pytest.mark.parametrize("case", ["pow2", "pow3", "i64_u64", "i32_u32", "i64_i32", "i64_u32"])
def test_float_to_int_then_another_int_type_wraps_as_eager(case, check):
    # Halide's simplifier folded the signedness cast after a float's conversion (int64 -> uint64 in a
    # wrapping multiply) into one fptoui: x.to(int64).pow(2) gave 1 for -2 (CPU fuzz, seed 1500). The
    # sign-split form it now prints needs uint64 literals past int32 (hl.cast took none).
    fns = {"pow2": lambda x: x.to(torch.int64).pow(2), "pow3": lambda x: x.to(torch.int64).pow(3),
           "i64_u64": lambda x: x.to(torch.int64).to(torch.uint64),
           "i32_u32": lambda x: x[:4].to(torch.int32).to(torch.uint32),
           "i64_i32": lambda x: x.to(torch.int64).to(torch.int32), "i64_u32": lambda x: x.to(torch.int64).to(torch.uint32)}
    check(fns[case], torch.tensor([2.04, 1.54, -2.77, -0.5, -3e9, 5e9]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_negation_flips_the_sign_of_zero(dtype, check):
    # Halide's unary minus is 0 - x: -(+0.0) came out +0.0, and an atan2 of it answered pi where
    # eager's is -pi (CPU fuzz, seed 1801: the std of equal values, negated).
    x = torch.tensor([0.0, -0.0, 1.5, float("nan"), float("-inf")], dtype=dtype)
    finite = x.nan_to_num(0.5)  # a NaN's sign bit after negation is not something eager keeps across dtypes
    actual, expected = check(lambda a, b: (-a, torch.atan2(-a, torch.full_like(a, -2.0)), torch.signbit(-b)), x, finite)
    assert torch.equal(actual[2], expected[2])


def test_unsigned_negation_wraps_and_abs_is_the_value(check, caplog):
    # uint8's neg and abs had no Halide form: the kernel ran in Triton's interpreter (CPU fuzz, seed 4001).
    x = torch.tensor([0, 1, 2, 127, 128, 255], dtype=torch.uint8)
    with caplog.at_level("WARNING", logger="smelt"):
        check(lambda a: (-a, a.abs(), (-a).abs() + 3, torch.neg(a * 2)), x)
    assert "instead of Halide" not in caplog.text


@pytest.mark.parametrize("source, target", [(torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)])
def test_every_half_float_converts_to_the_other_as_eager(source, target, compile_fn):
    """Fuzz seed 4361 (program 326): a bfloat16 mean of nothing (NaN) summed to float16 came out
    -inf. Halide folds cast(f16, cast(f32, b)) of a bfloat16 b into one conversion that makes every
    NaN inf; and a float16 NaN whose payload lies in the bits bfloat16 drops became inf. Every bit
    pattern of each half float, converted to the other and stored, is eager's (any NaN for a NaN)."""
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(source)
    actual = compile_fn(lambda x: x.to(target) * 1)(every)
    expected = every.to(target) * 1
    same = (actual.view(torch.int16) == expected.view(torch.int16)) | (actual.isnan() & expected.isnan())
    assert same.all(), every[~same][:8]


def test_a_signaling_nan_rounds_to_a_bfloat16_nan(compile_fn):
    """A float32 NaN whose payload lies only in the low 16 bits (a signaling NaN, read from memory or
    made by a bit view) became inf in bfloat16 on Halide, which rounds on the integer bits, and one
    whose top bits are all ones became -0.0 or +0.0; eager gives NaN. The guard is left out only where
    every NaN the value can be is one a bfloat16 holds (HalideKernel.rounds_unguarded): each op of
    handler.QUIETING_*, and each that passes a NaN's bits on, on such NaNs."""
    # Signaling NaNs, then NaNs whose top bits are all ones (the rounding carried them into -0.0 and
    # +0.0), then two numbers.
    bits = torch.tensor([0x7F800001, 0x7F800100, 0xFF800001 - (1 << 32), 0x7F80FFFF, 0x7FFFFFFF, -1, 0x7FFF8000,
                         0x3F800000, -0x40800000], dtype=torch.int32)
    one = torch.ones(9)
    ops = {
        "stored": lambda a: a, "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "erf": torch.erf,
        "log": torch.log, "tanh": torch.tanh, "clamp": lambda a: a.clamp(-1, 1),
        "maximum": lambda a: torch.maximum(a, one), "where": lambda a: torch.where(a > 0, 1.0, a),
        "copysign": lambda a: torch.copysign(a, one), "x * 1": lambda a: a * 1.0, "x / -1": lambda a: a / -1.0,
        "x + 0": lambda a: a + 0.0, "0 - x": lambda a: 0.0 - a, "x - 0": lambda a: a - 0.0,
        "add": lambda a: a + 2.0, "sub": lambda a: 2.0 - a, "mul": lambda a: a * 3.0, "div": lambda a: 1.0 / a,
        "exp": torch.exp, "sigmoid": torch.sigmoid, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
        "reciprocal": torch.reciprocal,
    }

    def program(ints, halves):
        x = ints.view(torch.float32)
        return [op(x).to(torch.bfloat16) for op in ops.values()] + [
            halves.float().to(torch.bfloat16), (halves.float() * 2).to(torch.bfloat16),
            (halves.to(torch.bfloat16) * 2).to(torch.bfloat16)]

    # Every float16 NaN through float32: 0x7FFF became 0x7FFFE000, which the rounding carried into -0.0.
    halves = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16)
    halves = halves[halves.isnan()]
    names = [*ops, "float16 -> float32 -> bfloat16", "float16 -> float32 * 2 -> bfloat16", "bfloat16 * 2"]

    for name, actual, expected in zip(names, compile_fn(program)(bits, halves), program(bits, halves)):
        assert torch.equal(actual.isnan(), expected.isnan()), (name, actual, expected)
        assert torch.equal(actual[~actual.isnan()], expected[~expected.isnan()]), (name, actual, expected)


@pytest.mark.parametrize("source, target", [(torch.int64, torch.int32), (torch.int64, torch.int16),
                                            (torch.int64, torch.int8), (torch.int32, torch.int8),
                                            (torch.int64, torch.uint8), (torch.int32, torch.int16)])
def test_an_argmax_of_a_narrowed_integer_searches_every_row(source, target, compile_fn):
    """CPU fuzz seed 4368: int64 -> int32 masked the low half (Halide's bounds [0, 2**32), which int32
    cannot hold), and Halide's trimming of no-op reduction steps then dropped the argmax's index search
    in the tail task of the rows (100 rows in tasks of 8: row 98 came out 0). Wide values wrap too."""
    torch.manual_seed(0)
    x = torch.randint(0, 3, (100, 2), dtype=source)
    x[:, 1] += torch.randint(0, 2, (100,), dtype=source) << (8 * target.itemsize)  # wraps away in target

    def program(v):
        return v.to(target).argmax(-1), v.to(target).argmin(-1)
    for actual, expected in zip(compile_fn(program)(x), program(x)):
        assert torch.equal(actual, expected), (actual != expected).nonzero().flatten()
