"""Programs eager runs that smelt must run the same way: data-dependent sizes, integer
arithmetic, special values, output strides, out-of-range scalars and indices."""
import functools
import re

import pytest
import torch
import torch._dynamo
from conftest import stops_like_eager_on_the_gpu

data_dependent = torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True)


# --- unbacked sizes: the wrapper binds u0 from the ATen call that produces it -----------------

@data_dependent
@pytest.mark.parametrize("fn", [
    lambda x: torch.nonzero(x > 0),
    lambda x: x[x > 0] * 2,
    lambda x: x[x > 0].sum(),
    lambda x: (x[x > 0].sum(), x[x < 0] + 1),
    lambda x: torch.masked_select(x, x > 0).exp(),
    lambda x: torch.unique(x.round(), return_counts=True),
    lambda x: torch.repeat_interleave(x, (x.abs() * 2).long()) + 1,
    lambda x: torch.zeros(int((x > 0).sum().item()), 3) + 1,
], ids=["nonzero", "mask", "mask_sum", "two_masks", "masked_select", "unique", "repeat_interleave", "item_size"])
def test_unbacked_sizes(check, device, fn):
    check(fn, torch.randn(64, device=device))


# --- output layouts: a view of a computed tensor keeps eager's strides and offset -------------

def _check_layouts(actual, expected):
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert (a.shape, a.stride(), a.storage_offset()) == (e.shape, e.stride(), e.storage_offset()), \
            f"output {k}: size/stride/offset {a.shape, a.stride(), a.storage_offset()} != eager's " \
            f"{e.shape, e.stride(), e.storage_offset()}"


@pytest.mark.parametrize("fn", [
    lambda x: (x + 1).t(),
    lambda x: (x + 1).reshape(2, 3, 8).permute(2, 0, 1),
    lambda x: (x + 1).transpose(0, 1),
    lambda x: (x[:, :1] + 1).expand(6, 8),
    lambda x: (x + 1)[::2],
    lambda x: (x + 1)[:, 1::3],
    lambda x: (x + 1).diagonal(),
    lambda x: (x + 1).unsqueeze(1),
    lambda x: (x + 1)[2],
    lambda x: (x + 1)[:, 2],
    lambda x: (x + 1).view(8, 6).t(),
    lambda x: ((x + 1).t(), x * 2),
    lambda x: (x.t() * 2, x.t().contiguous() + 1),
    lambda x: x.sum(0, keepdim=True).t(),
], ids=["t", "permute", "transpose", "expand", "rows_step", "cols_step", "diagonal", "unsqueeze", "select_row",
        "select_col", "view_t", "two_outputs", "dense_transposed", "reduction_t"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_output_strides_are_eagers(check, device, fn, dynamic):
    actual, expected = check(fn, torch.randn(6, 8, device=device), compile_kw={"dynamic": dynamic})
    _check_layouts(actual, expected)


# --- division with rounding over special values ---------------------------------------------

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3.0, -7.0, float("inf"), float("-inf"), float("nan"), 1e-20, 1e15]
# (Not 1e30 over 1e-30: eager's own float32 fmod is nan there in its 16-wide vector loop, exact in its tail.)
_DIVISIONS = {
    "floor_divide": torch.floor_divide, "fmod": torch.fmod, "remainder": torch.remainder,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
}


def _assert_same_bits(actual, expected):
    assert actual.dtype == expected.dtype
    if expected.dtype.is_floating_point:
        same = ((actual == expected) & (actual.signbit() == expected.signbit())) | (actual.isnan() & expected.isnan())
    else:
        same = actual == expected
    bad = (~same).nonzero().flatten()[:5].tolist()
    assert not bad, f"differs from eager at {bad}: {actual.flatten()[bad].tolist()} != {expected.flatten()[bad].tolist()}"


@pytest.mark.parametrize("name", list(_DIVISIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_division_special_values(compile_fn, device, name, dtype):
    op = _DIVISIONS[name]
    if dtype.is_floating_point:
        values = torch.tensor(_SPECIAL, dtype=dtype, device=device)
        scalars = [2, -0.0, float("inf")]
    else:
        values = torch.tensor([0, 1, -1, 2, -2, 3, -3, 7, -7, 2**31 - 1, -2**31 + 1], dtype=dtype, device=device)
        scalars = [2, -3]
    a, b = values.repeat_interleave(len(values)), values.repeat(len(values))
    if not dtype.is_floating_point:
        b = torch.where(b == 0, 5, b)  # eager raises on an integer division by zero
    _assert_same_bits(compile_fn(op)(a, b), op(a, b))
    for s in scalars:
        torch._dynamo.reset()
        fn = lambda a, s=s: op(a, s)  # noqa: E731
        _assert_same_bits(compile_fn(fn)(a), fn(a))
    if name != "fmod":  # fmod has no scalar-tensor form
        torch._dynamo.reset()
        fn = lambda b: op(5, b)  # noqa: E731
        _assert_same_bits(compile_fn(fn)(b), fn(b))


@pytest.mark.parametrize("name", ["fmod", "remainder"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_the_smallest_integer_over_minus_one(compile_fn, device, name, dtype):
    # 0 in eager; Halide's integer fmod divided in hardware, which traps on INT_MIN / -1 (SIGFPE:
    # the process ended).
    op = _DIVISIONS[name]
    a = torch.tensor([torch.iinfo(dtype).min, torch.iinfo(dtype).max, 5, -7], dtype=dtype, device=device)
    b = torch.tensor([-1, -1, -1, 2], dtype=dtype, device=device)
    _assert_same_bits(compile_fn(op)(a, b), op(a, b))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_signed_overflow_wraps_before_the_next_op(compile_fn, device, dtype):
    # Eager wraps. Halide takes a signed overflow as undefined and its simplifier folded each of these
    # (int32 and int64): (a + 1) > a to true, a wrapped product's quotient to a, abs(INT_MIN) >= 0.
    def fn(a):
        return ((a + 1) > a, (a * 2) // 2, a.abs() >= 0, -a < 0, torch.relu(a + 1), (a - 10 + 20) < a,
                (a * 6364136223846793005 + 1442695040888963407) % 1000)
    big = torch.iinfo(dtype).max
    a = torch.tensor([big, -big - 1, 5, -3, 0], dtype=dtype, device=device)
    for actual, expected in zip(compile_fn(fn)(a), fn(a)):
        assert torch.equal(actual, expected), (actual, expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_wrapping_ops_over_a_floats_conversion(compile_fn, device, dtype):
    # Halide folds reinterpret(u64, cast(i64, f)) into cast(u64, f), undefined for f < 0: DeBERTa's
    # clamp(-bucket + 8, 0, 15) of a bucket converted from float gave 9 for 10.
    fn = lambda f: (torch.clamp(-f.to(dtype) + 8, 0, 15), f.to(dtype).abs() * 3 - 1,  # noqa: E731
                    torch.bitwise_left_shift(f.to(dtype), torch.ones_like(f, dtype=dtype)))
    f = torch.tensor([-2.0, -7.0, 3.0, -0.5, 12.0], device=device)
    for actual, expected in zip(compile_fn(fn)(f), fn(f)):
        assert torch.equal(actual, expected), (actual, expected)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_shifts_by_the_width_or_more_or_by_a_negative_count(compile_fn, device, dtype):
    # Eager shifts everything out (a right shift of a negative value leaves -1); Halide's shift counts
    # wrapped, and a negative one shifted the other way.
    bits = dtype.itemsize * 8
    signed = dtype.is_signed
    a = torch.tensor([1, 7, -8 if signed else 200, 3, 5], dtype=dtype, device=device)
    counts = torch.tensor([bits, bits + 6, bits + 1, -1 if signed else bits - 1, 2], dtype=dtype, device=device)
    fn = lambda a, s: (torch.bitwise_left_shift(a, s), torch.bitwise_right_shift(a, s))  # noqa: E731
    for actual, expected in zip(compile_fn(fn)(a, counts), fn(a, counts)):
        assert torch.equal(actual, expected), (actual, expected)


@pytest.mark.parametrize("exponent", [0.5, -0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_half_powers_of_special_values(compile_fn, device, exponent, dtype):
    # ATen takes sqrt / rsqrt for these exponents (sqrt(-0.) is -0., rsqrt(-inf) nan), but pow itself
    # for float16 on the CPU: x ** -0.5 once went to pow everywhere.
    x = torch.tensor([-0.0, 0.0, -float("inf"), float("inf"), float("nan"), -4.0, 4.0, 0.25], dtype=dtype, device=device)
    fn = lambda x: x ** exponent  # noqa: E731
    _assert_same_bits(compile_fn(fn)(x), fn(x))


# --- integer tensors with Python scalars out of their range: the scalar wraps, as in eager ----

_SCALAR_OPS = {
    "add": lambda x, s: x + s, "sub": lambda x, s: x - s, "rsub": lambda x, s: s - x, "mul": lambda x, s: x * s,
    "and": lambda x, s: x & s, "or": lambda x, s: x | s, "xor": lambda x, s: x ^ s,
    "eq": lambda x, s: x == s, "ne": lambda x, s: x != s, "lt": lambda x, s: x < s, "le": lambda x, s: x <= s,
    "gt": lambda x, s: x > s, "ge": lambda x, s: x >= s, "where": lambda x, s: torch.where(x > 3, x, s),
}


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32])
def test_integer_tensor_with_out_of_range_scalar(compile_fn, device, dtype):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.min + 1, -5, 0, 3, 44, 100, info.max], device=device).to(dtype)
    for s in (300, -129, 2**33 + 7):
        ops_ = {name: op for name, op in _SCALAR_OPS.items() if _eager_accepts(op, x, s)}
        fn = lambda x, s=s: tuple(op(x, s) for op in ops_.values())  # noqa: E731
        torch._dynamo.reset()
        for name, actual, expected in zip(ops_, compile_fn(fn)(x), fn(x)):
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (name, s, actual, expected)


def _eager_accepts(op, x, s) -> bool:
    try:
        op(x, s)
        return True
    except RuntimeError:  # where: eager refuses a scalar that does not fit
        return False


REFUSED = {
    "clamp": lambda x: x.clamp(-1000, 1000), "clamp_max": lambda x: torch.clamp(x, max=-1000),
    "where": lambda x: torch.where(x > 0, x, 1000), "masked_fill": lambda x: x.masked_fill(x > 0, 1000),
    "fill": lambda x: x.clone().fill_(1000), "full_like": lambda x: torch.full_like(x, 1000) + x,
    "index_fill": lambda x: x.index_fill(0, torch.tensor([0, 2], device=x.device), 1000),
    "scatter": lambda x: x.scatter(0, torch.tensor([0, 2], device=x.device), 1000),
    "new_full": lambda x: x.new_full((2,), 1000) + 1, "negative_power": lambda x: x ** -1,
    "argmax_of_bools": lambda x: (x > 0).argmax(), "max_over_an_empty_dim": lambda x: x[:0].max(0),
    "floor_division_by_0": lambda x: x // 0, "remainder_by_0": lambda x: x % 0,
    "pad_value": lambda x: torch.nn.functional.pad(x, (1, 1), value=300), "max_of_nothing": lambda x: x[:0].max(),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_eager_refuses_is_refused(compile_fn, case):
    # Eager's argument checks that its meta kernels skip: smelt computed a value (1000 wrapped to -24).
    fn = REFUSED[case]
    x = torch.tensor([1, -3, 100], dtype=torch.int8)
    with pytest.raises((RuntimeError, IndexError, ZeroDivisionError)) as eager:
        fn(x)
    torch._dynamo.reset()
    with pytest.raises((RuntimeError, IndexError, ZeroDivisionError), match=re.escape(str(eager.value))):
        compile_fn(fn)(x)


# A number past a floating dtype's range: eager raises in each of these (smelt gave inf).
PAST_THE_RANGE = {
    "masked_fill": lambda x, v: x.masked_fill(x > 0, v), "fill": lambda x, v: x.clone().fill_(v),
    "full_like": lambda x, v: torch.full_like(x, v) + x, "full": lambda x, v: torch.full((3,), v, dtype=x.dtype) + x,
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([0, 2], device=x.device), v),
    "new_full": lambda x, v: x.new_full((2,), v) + 1, "clamp": lambda x, v: x.clamp(max=v),
    "pad_value": lambda x, v: torch.nn.functional.pad(x, (1, 1), value=v),
    "add_alpha": lambda x, v: x.add(x, alpha=v), "hardtanh": lambda x, v: torch.nn.functional.hardtanh(x, -abs(v), abs(v)),
    "threshold": lambda x, v: torch.nn.functional.threshold(x, 0.5, v),
    "hardshrink": lambda x, v: torch.nn.functional.hardshrink(x, abs(v)),
    "where": lambda x, v: torch.where(x > 0, x, v),
}


@pytest.mark.parametrize("dtype, value", [(torch.float16, 70000.0), (torch.float32, -1e39)], ids=["float16", "float32"])
@pytest.mark.parametrize("case", PAST_THE_RANGE)
def test_a_number_past_a_float_dtype_is_refused_where_eager_refuses_it(compile_fn, case, dtype, value):
    fn = functools.partial(PAST_THE_RANGE[case], v=value)
    x = torch.tensor([1.0, -3.0, 100.0], dtype=dtype)
    torch._dynamo.reset()
    try:
        expected = fn(x)
    except RuntimeError as eager:
        with pytest.raises(RuntimeError, match=re.escape(str(eager))):
            compile_fn(fn)(x)
    else:
        assert torch.equal(compile_fn(fn)(x), expected)


@pytest.mark.parametrize("case", ["add_alpha", "sub_alpha", "addcmul"])
def test_a_scalar_past_an_integer_dtype_is_refused_as_eager_refuses_it(compile_fn, case):
    # The same check on integer tensors: smelt computed int8 sums of x * 1000, wrapped.
    fn = {"add_alpha": lambda x: x.add(x, alpha=1000), "sub_alpha": lambda x: x.sub(x, alpha=1000),
          "addcmul": lambda x: torch.addcmul(x, x, x, value=1000)}[case]
    x = torch.tensor([1, 3, 100], dtype=torch.int8)
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=re.escape(str(eager.value))):
        compile_fn(fn)(x)


def test_numbers_past_the_range_that_eager_accepts_are_not_refused(compile_fn):
    # A float16 where(c, x, 70000.) decomposes as masked_fill does, and eager gives inf; nan_to_num's
    # posinf is not range-checked, and its decomposition is a float32 where(c, x, 1e39)'s, which
    # eager refuses (the case above): the program's own ops are checked before decomposing.
    for fn, x in ((lambda x: torch.where(x > 0, x, 70000.0), torch.tensor([1.0, -3.0], dtype=torch.float16)),
                  (lambda x: torch.nan_to_num(x / 0, posinf=1e39), torch.tensor([1.0, -3.0]))):
        torch._dynamo.reset()
        assert torch.equal(compile_fn(fn)(x), fn(x))


def test_the_range_check_leaves_index_errors_and_random_draws_to_the_program(compile_fn):
    # The check runs an op with a number past its tensors' range on small stand-ins: an index that
    # fits the real tensor but not a stand-in is no refusal, and a random op drawn there would move
    # the program's random stream.
    x = torch.arange(70010, dtype=torch.float16)
    fn = lambda x: x[70000] * 2  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(compile_fn(fn)(x), fn(x))

    from smelt.lowering.eager_refusals import refuse_numbers_as_eager
    graphs = []
    torch._dynamo.reset()
    torch.compile(lambda x: x.clone().normal_(70000.0, 1.0),
                  backend=lambda gm, inputs: graphs.append(gm) or gm)(torch.zeros(3, dtype=torch.float16))
    state = torch.get_rng_state()
    refuse_numbers_as_eager(graphs[0])
    assert torch.equal(torch.get_rng_state(), state)


def test_a_fill_of_one_element_is_eagers_inf(compile_fn):
    # Eager's CPU fill of one element skips the range check it makes on more: the refusal's
    # stand-ins keep a size-1 dim at one element, so this is not refused.
    fn = lambda x: x + torch.full((1,), 70000.0, dtype=torch.float16)  # noqa: E731
    x = torch.ones(1, dtype=torch.float16)
    torch._dynamo.reset()
    assert torch.equal(compile_fn(fn)(x), fn(x))


def test_symbolic_scalars_are_not_checked_against_eager(compile_fn):
    # The check runs eager on stand-ins: a symbolic scalar would be guarded on there (a size used as
    # a bound specialized a dynamic dim; pow by a size hit an internal assert; .item() values raised).
    x = torch.arange(5)
    torch._dynamo.mark_dynamic(x, 0)
    torch._dynamo.reset()
    assert torch.equal(compile_fn(lambda x: x.clamp(max=x.shape[0] * 3) + x.pow(x.shape[0] - 3))(x),
                       x.clamp(max=15) + x.pow(2))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        fn = lambda x, n: x.clamp(max=n.item()) + torch.full((6,), n.item(), dtype=torch.int8)  # noqa: E731
        x, n = torch.arange(6, dtype=torch.int8), torch.tensor(3)
        assert torch.equal(compile_fn(fn)(x, n), fn(x, n))


def test_a_crop_is_not_refused(compile_fn):
    # Pads are checked with the crop left out: a stand-in's one element cannot be cropped.
    fn = lambda x: torch.nn.functional.pad(x, (-2, 1), value=7)  # noqa: E731
    x = torch.arange(6, dtype=torch.int8).view(2, 3)
    torch._dynamo.reset()
    assert torch.equal(compile_fn(fn)(x), fn(x))


# --- integer pow: integer results that wrap as eager's --------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_pow(compile_fn, device, dtype):
    base = torch.tensor([-3, -2, -1, 0, 1, 2, 3, 5, 7, 100], device=device).to(dtype)
    exponent = torch.tensor([0, 1, 2, 3, 5, 31, 40, 62, 63, 64], device=device).to(dtype)
    if dtype.is_signed:
        exponent[0] = -3  # a negative tensor exponent: 1, +-1 or 0
    fn = lambda b, e: (b ** 0, 2 ** e, b ** 2, b ** e, b ** 13, torch.pow(b, 5), 3 ** b.abs(),  # noqa: E731
                       torch.pow(b, 2.5))
    for name, actual, expected in zip("b**0 2**e b**2 b**e b**13 pow(b,5) 3**|b| pow(b,2.5)".split(),
                                      compile_fn(fn)(base, exponent), fn(base, exponent)):
        assert actual.dtype == expected.dtype, name
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{name}: {m}")


# --- an index out of bounds raises, naming the op, where eager raises ------------------------

OUT_OF_BOUNDS = {
    "index": ("x[j] * 2", "index"),
    "negative": ("x[-j - 3] * 2", "index"),
    "index_select": ("torch.index_select(x, 0, j)", "index_select"),
    "gather": ("torch.gather(x, 0, j)", "gather"),
    "embedding": ("torch.nn.functional.embedding(j, x.view(5, 1))", "embedding"),
    # Eager's embedding refuses a negative id, which indexing counts from the end (a review).
    "embedding_negative": ("torch.nn.functional.embedding(3 - j, x.view(5, 1))", "embedding"),
    "index_select_negative": ("torch.index_select(x, 0, 3 - j)", "index_select"),
    "gather_negative": ("torch.gather(x, 0, 3 - j)", "gather"),
    # The writing siblings: eager's scatter, index_add, index_copy and index_reduce refuse a negative
    # index too, where smelt wrote into the row counted from the end.
    "scatter": ("x.scatter(0, j, x[:3] * 2)", "scatter"),
    "scatter_negative": ("x.scatter(0, 3 - j, x[:3] * 2)", "scatter"),
    "scatter_add_negative": ("x.scatter_add(0, 3 - j, x[:3])", "scatter_add"),
    "scatter_reduce_negative": ("x.scatter_reduce(0, 3 - j, x[:3], 'amax')", "scatter_reduce"),
    "index_reduce_negative": ("x.index_reduce(0, 3 - j, x[:3], 'prod')", "index_reduce"),
    "index_add_negative": ("x.index_add(0, 3 - j, x[:3])", "index_put"),
    "index_copy_negative": ("x.index_copy(0, 3 - j, x[:3])", "index_put"),
}


@pytest.mark.parametrize("case", OUT_OF_BOUNDS)
def test_index_out_of_bounds_raises(compile_fn, device, case):
    expr, op = OUT_OF_BOUNDS[case]
    fn = eval(f"lambda x, j: {expr}")
    x, j = torch.randn(5, device=device), torch.tensor([0, 2, 1], device=device)
    torch.testing.assert_close(compile_fn(fn)(x, j), fn(x, j))
    torch._dynamo.reset()
    if device != "cpu":
        return stops_like_eager_on_the_gpu(
            f"fn = lambda x, j: {expr}\nx = torch.randn(5, device='cuda')\nj = torch.tensor([0, 4, 7], device='cuda')",
            "fn(x, j)")
    j = torch.tensor([0, 4, 7], device=device)
    with pytest.raises(Exception):
        fn(x, j)
    with pytest.raises(Exception, match="out of bounds") as error:
        compile_fn(fn)(x, j)
    assert op in str(error.value), str(error.value)


@pytest.mark.parametrize("op", ["index_add", "index_copy", "index_fill"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.float32])
def test_an_index_of_a_dtype_eager_refuses_is_refused(compile_fn, device, op, dtype):
    # The negative-index rewrites of these decompositions turned a bool index into rows 0 and 1
    # (a review); eager takes int64, and index_add int32 too.
    fn = {"index_add": lambda x, i: x.index_add(0, i, torch.ones(2, 2, device=x.device)),
          "index_copy": lambda x, i: x.index_copy(0, i, torch.ones(2, 2, device=x.device)),
          "index_fill": lambda x, i: x.index_fill(0, i, 2.0)}[op]
    x, i = torch.zeros(3, 2, device=device), torch.tensor([1, 0], device=device).to(dtype)
    if op == "index_add" and dtype == torch.int32:
        torch.testing.assert_close(compile_fn(fn)(x, i), fn(x, i))
        return
    with pytest.raises(Exception):
        fn(x, i)
    with pytest.raises(Exception, match=f"{op}_\\(\\): Expected"):
        compile_fn(fn)(x, i)


def test_index_add_with_a_zero_dimensional_index(compile_fn, device):
    # torch's decomposition handed the 0-d index to index_put, which failed to lower (a review).
    fn = lambda x, j, s: x.index_add(0, j, s, alpha=2)  # noqa: E731
    args = (torch.randn(5, 3, device=device), torch.tensor(1, device=device), torch.randn(1, 3, device=device))
    torch.testing.assert_close(compile_fn(fn)(*args), fn(*args))


SCATTERS_INTO_A_SCALAR = {
    "scatter": lambda x, i: x.scatter(0, i, x * 5),
    "scatter_value": lambda x, i: x.scatter(0, i, 7.0),
    "scatter_add": lambda x, i: x.scatter_add(0, i, x * 5),
    "scatter_reduce": lambda x, i: x.scatter_reduce(0, i, x * 5, "amax"),
    "index_reduce": lambda x, i: x.index_reduce(0, i.reshape(1), x * 5, "prod"),
}


@pytest.mark.parametrize("op", sorted(SCATTERS_INTO_A_SCALAR))
def test_a_scatter_into_a_scalar_checks_its_index(compile_fn, device, op):
    # Halide checked the position only where a store used it, and a 0-d target's store uses none:
    # -1 and 1 wrote the value where eager raises (a review).
    fn = SCATTERS_INTO_A_SCALAR[op]
    x = torch.tensor(1.5, device=device)
    torch.testing.assert_close(compile_fn(fn)(x, torch.tensor(0, device=device)), fn(x, torch.tensor(0, device=device)))
    if device != "cpu":
        return  # eager's CUDA kernels stop the process (a device-side assert)
    for bad in (-1, 1):
        i = torch.tensor(bad, device=device)
        with pytest.raises(Exception):
            fn(x, i)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="out of bounds"):
            compile_fn(fn)(x, i)


def test_index_fill_counts_a_negative_index_from_the_end(compile_fn, device):
    # Its decomposition is an index_copy, which refuses a negative index as eager's does.
    fn = lambda x, j: x.index_fill(0, j - 3, -1.0)  # noqa: E731
    x, j = torch.randn(5, 2, device=device), torch.tensor([0, 2], device=device)
    torch.testing.assert_close(compile_fn(fn)(x, j), fn(x, j))


# --- half floats: every op's result is rounded to the half float, as eager rounds it -------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [
    lambda x, y: ((x * y) + x) * y - x,
    lambda x, y: (x * 1.5 + y * 0.1) * (x - y),
    lambda x, y: torch.maximum(-x * y, x.abs() + y),
    lambda x, y: (x * y).sum(-1, keepdim=True) + x * y,
    lambda x, y: x.pow(3) - y.pow(2),  # ATen cubes in the half type (CPU: bfloat16 only, float16 in float32)
], ids=["chain", "scalars", "exact_ops", "reduction_epilogue", "cube"])
def test_half_float_results_are_rounded_per_op(compile_fn, device, dtype, fn):
    # Products and sums of half floats are exact in float32, so rounding after each op as eager
    # does gives eager's bits; keeping float32 digits between fused ops does not.
    x, y = (torch.randn(64, 33, device=device).to(dtype) for _ in range(2))
    _assert_same_bits(compile_fn(fn)(x, y), fn(x, y))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_float_amin_backward_finds_its_minimum(compile_fn, device, dtype):
    # amin's backward compares x * 1.5 recomputed with the stored (rounded) minimum: an unrounded
    # product never equals it, and the gradient was 0 / 0.
    fn = lambda x: (x * 1.5).amin(0)  # noqa: E731
    x = torch.tensor([0.9258, 0.3], dtype=dtype, device=device)[:1].clone().requires_grad_()
    compile_fn(fn)(x).backward()
    assert x.grad.tolist() == [1.5]


# --- a CPU scalar tensor operand does not move a CUDA op to the CPU -------------------------------

@pytest.mark.parametrize("fn", [
    lambda x, i: torch.gather(x.clone().copy_(torch.ones(())), 1, i),
    lambda x, i: torch.gather(x.clone().fill_(torch.tensor(3.0)), 1, i),
    lambda x, i: torch.gather(torch.where(x > 0, torch.tensor(1.0), x), 1, i),
    lambda x, i: torch.gather(torch.tensor(2.0) * x, 1, i),
], ids=["copy_", "fill_", "where", "mul"])
def test_cpu_scalar_operand_keeps_the_ops_device(compile_fn, device, fn):
    # Found by the fuzzer on the H100: copy_ of torch.ones(()) into a CUDA slice was built on the
    # CPU (the first tensor operand's device), and the gather reading it raised.
    x = torch.randn(4, 6, device=device)
    i = torch.randint(0, 6, (4, 3), device=device)
    actual, expected = compile_fn(fn)(x, i), fn(x, i)
    assert actual.device == expected.device
    torch.testing.assert_close(actual, expected)


# --- values made of literals alone keep their dtype: Triton reads a Python float as float32 and a
# small int as int32 (the H100 fuzzer's sign(float64) / 3 was divided in float32) -------------------

@pytest.mark.parametrize("fn", [
    lambda a: torch.sign(a) / 3,
    lambda a: torch.where(a > 0, torch.tensor(1.0, dtype=a.dtype), torch.tensor(0.0, dtype=a.dtype)) / 3,
    lambda a: torch.full_like(a, 1.0) / 3 + a * 0,
    lambda a: torch.ones(5, 3, dtype=a.dtype, device=a.device) / 3 + a,
    lambda a: torch.ones_like(a).tril() / 3,
    lambda a: torch.softmax(torch.sign(a), 0),
], ids=["sign", "where", "full_like", "ones", "tril", "sign_softmax"])
def test_float64_values_of_literals_are_float64(compile_fn, device, fn):
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    torch.testing.assert_close(compile_fn(fn)(x), fn(x), atol=0, rtol=1e-15)


@pytest.mark.parametrize("fn", [
    lambda a: torch.ones_like(a) * (2 ** 31 - 1) * 4 + a,
    lambda a: torch.where(a > 0, 2 ** 31 - 1, 7) + 1,
    lambda a: torch.full_like(a, 2 ** 31 - 1) + 1 + a * 0,
], ids=["ones_mul", "where", "full_like"])
def test_int64_values_of_literals_do_not_wrap_at_int32(compile_fn, device, fn):
    x = torch.randint(-5, 5, (5, 3), device=device)
    torch.testing.assert_close(compile_fn(fn)(x), fn(x), atol=0, rtol=0)


# --- a value built from literals alone keeps its narrow type ------------------------------------

def _zeroed_every_third_then_remainder(x):
    v = x.clone()
    v[..., ::3].zero_()
    return torch.remainder(v, x.abs() + 1)


def _add_alpha_then_fmod(x):
    return torch.fmod(x.add(1, alpha=2), x.abs() + 1)  # the alpha product 1 * 2 is two literals


def _same_constant_either_way_then_wrap(x):
    y = torch.where(x > 0, torch.full_like(x, 100), torch.full_like(x, 100)) + 100
    return y, y > 0


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.bfloat16])
@pytest.mark.parametrize("fn", [_zeroed_every_third_then_remainder, _add_alpha_then_fmod,
                                _same_constant_either_way_then_wrap],
                         ids=["zero_slice_remainder", "add_alpha_fmod", "where_of_constants_wraps"])
def test_a_value_of_literals_alone_keeps_the_narrow_type(compile_fn, device, dtype, fn):
    # Triton types where(c, 0, 0) and 1 * 2 int32 (float32): a uint8 value built from one met a uint8 in `//`
    # and did not compile (H100 fuzzer), and an int8 one would not wrap at 127.
    x = torch.arange(-6, 6, device=device).to(dtype).reshape(1, 2, 6)
    if dtype == torch.uint8:
        x = x + 6
    actual, expected = compile_fn(fn)(x), fn(x)
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,), expected if isinstance(expected, tuple) else (expected,)):
        assert a.dtype == e.dtype and torch.equal(a, e), (a, e)


# --- float to narrow integers: eager converts through a wide integer, then wraps ----------------

def _copy_into_slice(out, x):
    out = out.clone()
    out[:, :, 1:].copy_(x)
    return out


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
@pytest.mark.parametrize("fn", [
    lambda x, out: x.to(out.dtype),
    lambda x, out: _copy_into_slice(out, x),
    lambda x, out: out.slice_scatter(x.to(torch.int32).to(out.dtype), 2, 1),
], ids=["cast", "masked_copy", "through_int32"])
def test_float_to_narrow_integer_wraps_as_eager(compile_fn, device, dtype, fn):
    # Halide's simplifier folded cast(u8, cast(i32, f)) into fptoui, which vector code turned into
    # 0 for negative values (eager: -1.5 -> 255); CUDA's float-to-u8 conversion saturates.
    x = (torch.linspace(-300, 300, 16, device=device) + 0.25).reshape(4, 4, 1)
    out = torch.zeros(4, 4, 2, dtype=dtype, device=device)
    actual, expected = compile_fn(fn)(x, out), fn(x, out)
    assert torch.equal(actual, expected), (actual - expected).nonzero()[:5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.bool])
def test_copysign_keeps_the_sign_of_zero(compile_fn, device, dtype):
    # The fuzzer's atan2(0, copysign(False, -0.5)): Halide's copysign gave +0 (its -x is 0 - x), and
    # atan2 then 0 where eager's is pi. Every special value against every sign, bools as magnitudes.
    values = torch.tensor(_SPECIAL, device=device)
    magnitudes = (values != 0) if dtype == torch.bool else values.to(dtype)
    a, b = magnitudes.repeat_interleave(len(values)), values.repeat(len(values))
    _assert_same_bits(compile_fn(torch.copysign)(a, b), torch.copysign(a, b))
    torch._dynamo.reset()
    fn = lambda a, b: torch.atan2(torch.zeros_like(b), torch.copysign(a, b))  # noqa: E731
    _assert_same_bits(compile_fn(fn)(a, b), fn(a, b))
