"""Reductions over first / middle / last / all dims, looped (long-row) reductions, ties."""

import pytest
import torch

SHAPE = (5, 7, 33)
DIMS = [pytest.param(0, id="dim0"), pytest.param(1, id="dim1"), pytest.param(2, id="dim2"), pytest.param(None, id="all")]
LONG = (4, 5000)
# long reductions accumulate in a different order than eager
LONG_TOL = dict(atol=1e-4, rtol=1e-4)


def _float_input(device):
    return torch.randn(SHAPE, device=device)


def _red(op, dim, **kw):
    """torch.<op>(x) over all elements when dim is None, else torch.<op>(x, dim=dim, **kw)."""
    f = getattr(torch, op)
    if dim is None:
        return lambda x: f(x)
    return lambda x: f(x, dim=dim, **kw)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "prod"])
def test_float_reduction_over_dim(op, dim, device, check):
    if op == "prod":
        x = 1 + 0.05 * torch.randn(SHAPE, device=device)  # keep products O(1)
    else:
        x = _float_input(device)
    red = _red(op, dim)
    check(lambda x: red(x * 2 - 0.5 if op != "prod" else x), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_reductions_keepdim_true(dim, device, check):
    x = _float_input(device)
    actual, expected = check(
        lambda x: (
            torch.sum(x, dim=dim, keepdim=True),
            torch.amax(x, dim=dim, keepdim=True) - 1,
            torch.argmax(x, dim=dim, keepdim=True),
            torch.mean(x, dim=dim, keepdim=True),
        ),
        x,
    )
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dim() == 3


@pytest.mark.parametrize("dim", DIMS)
def test_argmax_argmin_over_dim(dim, device, check):
    x = _float_input(device)
    amax, amin = _red("argmax", dim), _red("argmin", dim)
    actual, _ = check(lambda x: (amax(x * 3), amin(x + 1)), x)
    assert actual[0].dtype == torch.int64 and actual[1].dtype == torch.int64


@pytest.mark.parametrize("dim", DIMS)
def test_argmax_argmin_ties_pick_first_occurrence(dim, device, check):
    # integer-valued floats from a small range -> lots of ties
    x = torch.randint(0, 3, SHAPE, device=device).float()
    amax, amin = _red("argmax", dim), _red("argmin", dim)
    check(lambda x: (amax(x), amin(x)), x)


def test_argmax_all_equal_returns_zero(device, check):
    x = torch.ones(SHAPE, device=device)
    actual, _ = check(lambda x: (torch.argmax(x, dim=2), torch.argmin(x, dim=0)), x)
    assert (actual[0] == 0).all() and (actual[1] == 0).all()


@pytest.mark.parametrize("dim", DIMS)
def test_any_all_over_dim_on_bool(dim, device, check):
    mostly_true = torch.rand(SHAPE, device=device) < 0.95  # `all` yields a True/False mix
    mostly_false = torch.rand(SHAPE, device=device) < 0.02  # `any` yields a True/False mix
    red_all, red_any = _red("all", dim), _red("any", dim)
    actual, _ = check(lambda a, b: (red_all(a), red_any(b)), mostly_true, mostly_false)
    assert actual[0].dtype == torch.bool and actual[1].dtype == torch.bool


def test_any_all_of_comparison_on_float(device, check):
    x = _float_input(device)
    check(lambda x: ((x > 2.0).any(dim=-1), (x > -3.0).all(dim=1)), x)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dim", DIMS)
def test_var_mean(dim, correction, device, check):
    x = _float_input(device)
    if dim is None:
        fn = lambda x: torch.var_mean(x, correction=correction)  # noqa: E731
    else:
        fn = lambda x: torch.var_mean(x, dim=dim, correction=correction)  # noqa: E731
    check(fn, x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", [0, 2])
def test_var_mean_keepdim(dim, device, check):
    x = _float_input(device)
    check(lambda x: torch.var_mean(x, dim=dim, correction=1, keepdim=True), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", DIMS)
def test_var_and_std(dim, device, check):
    x = _float_input(device) * 3 + 1
    if dim is None:
        fn = lambda x: (torch.var(x), torch.std(x, correction=0))  # noqa: E731
    else:
        fn = lambda x: (torch.var(x, dim=dim), torch.std(x, dim=dim, correction=0))  # noqa: E731
    check(fn, x, atol=1e-5, rtol=1e-5)


def test_reduction_over_multiple_dims(device, check):
    x = _float_input(device)
    check(lambda x: (x.sum(dim=(0, 2)), x.amax(dim=(0, 1), keepdim=True), x.mean(dim=(1, 2))), x)


def test_integer_sum_promotes_to_int64(device, check):
    x = torch.randint(-10, 10, SHAPE, device=device, dtype=torch.int32)
    actual, _ = check(lambda x: (x.sum(dim=1), x.sum()), x)
    assert actual[0].dtype == torch.int64


@pytest.mark.parametrize("op", ["sum", "prod", "nansum"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_float_dtype_converts_the_input_first(device, check, op, dtype):
    # As eager: float32 values are rounded to `dtype` before they are accumulated (past float16's
    # range they are inf; under its least step, 0). smelt once accumulated the float32 values and
    # rounded only the result.
    x = torch.tensor([[7e4, -7e4, 1.0, 2.0], [1e5, 1e-3, 3.0, 1e-8], [1.0 + 2 ** -9] * 4], device=device)
    f = getattr(torch, op)
    # (a relative 1e-2 for bfloat16's products, which eager may round at each step)
    check(lambda x: (f(x, 1, dtype=dtype), f(x[1:], dtype=dtype)), x, atol=0, rtol=1e-2)


def test_bool_sum_counts_true(device, check):
    x = torch.rand(SHAPE, device=device) > 0.5
    check(lambda x: x.sum(dim=-1), x)


def test_reduction_followed_by_broadcast_pointwise(device, check):
    x = _float_input(device)
    check(lambda x: x - x.mean(dim=-1, keepdim=True) * x.amax(dim=0), x)


# --- long rows: reductions that cannot fit in a single block ------------------


def test_long_row_sum(device, check):
    x = torch.randn(LONG, device=device)
    check(lambda x: (x.sum(dim=-1), (x * 2).sum()), x, **LONG_TOL)


def test_long_row_amax_amin(device, check):
    x = torch.randn(LONG, device=device)
    x[2, 4999] = 10.0  # max in the last element of the row
    x[1, 0] = -10.0
    check(lambda x: (x.amax(dim=-1), x.amin(dim=-1)), x)


def test_long_row_argmax(device, check):
    x = torch.randint(0, 5, LONG, device=device).float()  # ties across blocks
    check(lambda x: (x.argmax(dim=-1), x.argmin(dim=-1)), x)


@pytest.mark.parametrize("correction", [0, 1])
def test_long_row_var_mean(correction, device, check):
    x = torch.randn(LONG, device=device) * 2 + 5  # nonzero mean stresses the variance algorithm
    check(lambda x: torch.var_mean(x, dim=-1, correction=correction), x, **LONG_TOL)


def test_long_column_sum(device, check):
    x = torch.randn(5000, 3, device=device)
    check(lambda x: x.sum(dim=0), x, **LONG_TOL)


INTEGER_REDUCTIONS = {
    "any_dim_keepdim": lambda a: a.any(1, keepdim=True), "all_dim": lambda a: a.all(0), "any": lambda a: a.any(),
    "all": lambda a: a.all(), "any_dims": lambda a: torch.any(a, dim=(0, 1)), "sum": lambda a: a.sum(1),
    "prod": lambda a: a.prod(0), "amax": lambda a: a.amax(1), "argmin": lambda a: a.to(torch.int16).argmin(1),
    "count_nonzero": lambda a: torch.count_nonzero(a, 1), "max_dim": lambda a: a.max(1),
    "cumsum": lambda a: a.cumsum(1),
}


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32], ids=str)
@pytest.mark.parametrize("name", sorted(INTEGER_REDUCTIONS))
def test_integer_and_bool_reductions_give_eagers_dtype(name, dtype, device, check):
    # any/all of uint8 give uint8 in eager (a legacy rule); smelt built bool and refused the graph.
    check(INTEGER_REDUCTIONS[name], torch.randint(0, 3, (4, 5), device=device).to(dtype))


# An input expanded to size 0 has a null data_ptr() though its storage is real, and its reads
# fold to a fixed address or one per row. Halide took the null pointer for a bounds query (the
# kernel ran nothing and returned success: prod over the empty rows gave garbage); Triton loaded
# from it unmasked (the interpreter died).
EXPANDED_EMPTY_SOURCES = {
    "one_element": ((1, 1, 1), (0, 1, 1), 0),
    "per_row": ((3, 1), (3, 0), 1),
    "one_column": ((1, 1), (3, 0), 1),
    "per_row_inner": ((3, 1, 2), (3, 0, 2), 1),
}
EMPTY_ROW_REDUCTIONS = {
    "sum": lambda a, d: a.sum(d), "prod": lambda a, d: a.prod(d), "softmax": lambda a, d: torch.softmax(a, d),
    "cumsum": lambda a, d: a.cumsum(d), "var": lambda a, d: a.var(d), "mean_of_scaled": lambda a, d: (a * 2).mean(d),
}


@pytest.mark.parametrize("source", sorted(EXPANDED_EMPTY_SOURCES))
@pytest.mark.parametrize("name", sorted(EMPTY_ROW_REDUCTIONS))
def test_reductions_over_an_input_expanded_to_size_0(source, name, device, check):
    size, expanded, dim = EXPANDED_EMPTY_SOURCES[source]
    x = torch.randn(size, device=device).expand(expanded)
    check(lambda a: EMPTY_ROW_REDUCTIONS[name](a, dim), x)
    if name in ("sum", "prod"):
        check(lambda a: EMPTY_ROW_REDUCTIONS[name](a, dim), x.to(torch.int8))


def test_every_reduction_kind_is_one_record():
    # Lowering, the split and row-split strategies and the printers read one table of kinds
    # (smelt/ir/reduction_kinds.py); an unknown kind is an error naming the known ones.
    from smelt.ir.reduction_kinds import KINDS, kind, reduction_identity
    assert kind("welford_reduce").outputs == 3 and kind("online_softmax_reduce").outputs == 2
    assert {k for k, v in KINDS.items() if v.row_combinable} == {"sum", "max", "min", "online_softmax_reduce"}
    assert reduction_identity("argmin", torch.int8) == 127 and reduction_identity("max", torch.float16) == float("-inf")
    with pytest.raises(ValueError, match="unknown reduction kind 'mean'.*sum"):
        kind("mean")


@pytest.mark.parametrize("layout", ["row", "column"])
@pytest.mark.parametrize("op", ["var", "sum_of_squares"])
def test_long_reductions_of_unknown_length_stay_within_an_ulp(op, layout, device, monkeypatch):
    """1M values (a row, or 256k down each of 4 columns) of unknown length and not split: a
    lane that added up a value a loop step in float32 drifted (Triton's interpreter: var 4.2e-7
    off; the H100 over 64M values: 2.6e-6, Inductor 6e-8). Each backend keeps such sums exact
    to about the final rounding."""
    monkeypatch.setenv("SMELT_SPLIT_REDUCTIONS", "0")
    dim = 0 if layout == "column" else -1
    fn = {"var": lambda x: torch.var(x, dim), "sum_of_squares": lambda x: (x * x).sum(dim)}[op]
    torch.manual_seed(0)
    x = torch.randn(1 << 20, device=device) + 3
    x = x.view(-1, 4) if layout == "column" else x
    actual = torch.compile(fn, backend="smelt", dynamic=True)(x).double()
    exact = fn(x.double())
    error = ((actual - exact).abs() / exact.abs()).max().item()
    assert error < 1.2e-7, (op, layout, error)
