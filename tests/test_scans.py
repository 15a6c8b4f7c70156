"""Scans: cumsum, cumprod, cummax, cummin, logcumsumexp, in registers and block by block."""
import pytest
import torch

nan, inf = float("nan"), float("inf")


@pytest.fixture
def looped(monkeypatch):
    """Rows longer than 16 are scanned block by block, carrying the running value."""
    monkeypatch.setenv("SMELT_PERSISTENT_SCAN_LIMIT", "16")


def _no_fallback(observe):
    """No scan ran through ATen (other ops, such as flip in a backward graph, are not ours here)."""
    fallbacks = [op for g in observe.compiled_graphs() for op in g.fallback_ops]
    assert not [op for op in fallbacks if "cum" in op], fallbacks


@pytest.mark.parametrize("dim", [0, 1, -1, 2, -3])
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp"])
def test_single_value_scans(device, check, observe, op, dim):
    x = torch.rand(5, 6, 7, device=device) + 0.5
    check(lambda x: getattr(torch, op)(x, dim), x, atol=1e-5, rtol=1e-5)
    _no_fallback(observe)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin(device, check, observe, op, dim):
    x = torch.randn(6, 9, 4, device=device)
    check(lambda x: getattr(torch, op)(x, dim), x)
    _no_fallback(observe)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin_ties_and_nan(device, check, op):
    # Ties take the last index; NaN wins and sticks, each later NaN taking over the index.
    row = [1., 3., 3., 0., 3., nan, 5., nan, -inf, 2.]
    x = torch.tensor([row, row[::-1], [2.] * 10, [-inf] * 5 + [inf] * 5], device=device)
    check(lambda x: getattr(torch, op)(x, 1), x)
    check(lambda x: getattr(torch, op)(x.t(), 0), x)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_cummax_cummin_integers(device, check, op, dtype):
    x = torch.randint(0, 3, (4, 11), device=device).to(dtype)  # many ties
    check(lambda x: getattr(torch, op)(x, 1), x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.bool])
def test_cumsum_cumprod_of_integers_promote_to_int64(device, check, observe, dtype):
    x = torch.randint(0, 3, (3, 9), device=device).to(dtype)
    check(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 0)), x)
    _no_fallback(observe)


def test_dtype_argument(device, check):
    x = torch.randint(-5, 5, (4, 6), device=device, dtype=torch.int32)
    y = torch.rand(4, 6, device=device, dtype=torch.float16)
    check(lambda x, y: (torch.cumsum(x, 1, dtype=torch.float64), torch.cumprod(x, 0, dtype=torch.int32),
                        torch.cumsum(y, 1, dtype=torch.float32)), x, y)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes(device, check, compile_fn, dtype):
    x = torch.randn(5, 33, device=device, dtype=dtype)

    def fn(x):
        return torch.cumsum(x, 1), torch.cummax(x, 0), torch.logcumsumexp(x, 1)
    if dtype == torch.float64:
        check(fn, x)
        return
    # smelt accumulates half floats in float32 and rounds once; eager on CUDA rounds as it goes,
    # so the reference is the float64 result rounded to the dtype.
    actual = compile_fn(fn)(x)
    wide = fn(x.double())
    expected = (wide[0].to(dtype), (wide[1][0].to(dtype), wide[1][1]), wide[2].to(dtype))
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=1e-2)


def test_logcumsumexp_infinities_and_nan(device, check):
    x = torch.tensor([[-inf, -inf, 1., -inf], [inf, 2., inf, -inf], [1., nan, 2., 3.], [-inf] * 4],
                     device=device)
    check(lambda x: torch.logcumsumexp(x, 1), x)


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"])
def test_zero_dim_one_element_and_empty(device, check, observe, op):
    fn = getattr(torch, op)
    check(lambda x, y, z: (fn(x, 0), fn(x, -1), fn(y, 1), fn(z, 0), fn(z, 1)),
          torch.tensor(1.5, device=device), torch.randn(3, 1, device=device), torch.randn(0, 4, device=device))
    check(lambda x: fn(x, 1), torch.randn(3, 0, device=device))


@pytest.mark.parametrize("dim", [0, 1])
def test_long_rows_loop_over_blocks(device, check, looped, dim):
    # With a scan limit of 16 every row is scanned in many blocks. The interpreter runs a combine
    # of smelt's own element by element, so those rows are shorter than the cumsum's.
    def rows(n):
        return torch.rand(3, n, device=device) if dim == 1 else torch.rand(n, 3, device=device)
    check(lambda x: torch.cumsum(x, dim), rows(10000), atol=1e-3, rtol=1e-5)
    check(lambda x: (torch.logcumsumexp(x, dim), torch.cummax(x, dim)), rows(1000), atol=1e-4, rtol=1e-5)


def test_long_rows_in_registers(device, check):
    # The default limit keeps a 4096-long row in registers; 10000 takes the loop.
    check(lambda x, y: (torch.cumsum(x, 0), torch.cumsum(y, 0)),
          torch.rand(4096, device=device, dtype=torch.float64), torch.rand(10000, device=device, dtype=torch.float64))


def test_looped_integer_and_nan_carry(device, check, looped):
    # The carry between blocks must keep NaN, an int64 index and bool values exactly.
    x = torch.randn(2, 100, device=device)
    x[0, 37] = nan
    b = torch.rand(2, 100, device=device) > 0.7
    check(lambda x, b: (torch.cummax(x, 1), torch.cummin(b, 1), torch.cumsum(b, 1), torch.cumprod(x, 1)), x, b)


def test_input_pointwise_fuses_into_scan(device, check, kernel_count):
    x = torch.randn(8, 50, device=device)
    check(lambda x: torch.cumsum(x * 2 + 1, 1), x, atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1


def test_values_and_indices_in_one_kernel(device, check, kernel_count):
    x = torch.randn(8, 50, device=device)
    check(lambda x: torch.cummin(x.abs(), 1), x)
    assert kernel_count() == 1


def test_scan_then_pointwise_and_scan_of_scan(device, check, kernel_count, looped):
    x = torch.rand(4, 60, device=device)
    check(lambda x: torch.cumsum(torch.cumsum(x, 1), 1) / 3, x, atol=1e-4, rtol=1e-5)
    assert kernel_count() == 1


@pytest.mark.parametrize("scan_limit", ["4096", "16"])
def test_scan_and_reductions_of_the_same_rows_share_a_kernel(device, check, kernel_count, monkeypatch, scan_limit):
    # The scan reads the row max (a second pass over r); the sum reads the scan (same pass).
    monkeypatch.setenv("SMELT_PERSISTENT_SCAN_LIMIT", scan_limit)
    x = torch.randn(6, 40, device=device)
    check(lambda x: (torch.cumsum(x - x.amax(1, keepdim=True), 1), torch.cumsum(x, 1).sum(1)), x,
          atol=1e-4, rtol=1e-5)
    assert kernel_count() == 1


def test_scan_of_strided_and_broadcast_inputs(device, check):
    x = torch.randn(7, 5, device=device)
    check(lambda x: torch.cumsum(x.t(), 1), x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cumsum(x[:, :1].expand(7, 9), 1), x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cummax(torch.arange(9, device=x.device).flip(0).expand(3, 9), 1), x)


def test_dynamic_shapes(device, check):
    for n in (5, 9):
        x = torch.randn(3, n, device=device)
        check(lambda x: (torch.cumsum(x, 1), torch.cummax(x, 0)), x, compile_kw={"dynamic": True},
              atol=1e-5, rtol=1e-5)


def test_cumulative_trapezoid(device, check, observe):
    x = torch.randn(4, 12, device=device)
    check(lambda x: torch.cumulative_trapezoid(x, dim=1), x, atol=1e-5, rtol=1e-5)
    _no_fallback(observe)


def test_backward_of_cumsum_and_cumprod(device, compile_fn, assert_close, observe):
    # cumsum's gradient is a reversed cumsum (flip, cumsum, flip): scans in the backward graph too.
    def loss(x):
        return (torch.cumsum(x, 1).pow(2) + torch.cumprod(x, 0)).sum()

    x = torch.rand(4, 12, device=device) + 0.5
    compiled_leaf, eager_leaf = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compile_fn(loss)(compiled_leaf).backward()
    loss(eager_leaf).backward()
    assert_close(compiled_leaf.grad, eager_leaf.grad, atol=1e-4, rtol=1e-4)
    _no_fallback(observe)


def test_reading_one_element_of_a_scan(device, check):
    # A per-row reader of the scan's last element may not run inside the scan's kernel.
    x = torch.randn(6, 40, device=device)
    check(lambda x: torch.cumsum(x, 1)[:, -1] * 2, x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cumprod(x, 0)[2] + 1, x, atol=1e-5, rtol=1e-5)


@torch.library.custom_op("smelt_test::linear_recurrence", mutates_args=())
def linear_recurrence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h[t] = a[t] * h[t-1] + b[t] along the last dim, h[-1] = 0."""
    out, h = torch.empty_like(b), torch.zeros_like(b[..., 0])
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out[..., t] = h
    return out


@linear_recurrence.register_fake
def _(a, b):
    return torch.empty_like(b)


@pytest.mark.smelt_only
@pytest.mark.parametrize("scan_limit", ["4096", "16"])
def test_generic_combine_that_does_not_commute(device, check, monkeypatch, scan_limit):
    # (a1, b1) then (a2, b2) composes to (a1 * a2, a2 * b1 + b2): order matters, in a block and
    # across the carry between blocks.
    from smelt.ir import ScanCombine, ops
    from smelt.lowering.registry import LOWERINGS, lowering
    from smelt.lowering.scans import make_scan

    def compose(earlier, later):
        return ops.mul(earlier[0], later[0]), ops.add(ops.mul(later[0], earlier[1]), later[1])
    combine = ScanCombine("affine", 2, compose)

    def lower(g, a, b):
        load_a, load_b = a.make_loader(), b.make_loader()
        _, h = make_scan(g, b, -1, combine, lambda _, index, __: (load_a(index), load_b(index)),
                         (torch.float32, torch.float32))
        return h

    monkeypatch.setenv("SMELT_PERSISTENT_SCAN_LIMIT", scan_limit)
    op = torch.ops.smelt_test.linear_recurrence.default
    lowering(op)(lower)
    try:
        a = torch.rand(3, 50, device=device) * 0.5 + 0.5
        b = torch.randn(3, 50, device=device)
        check(lambda a, b: torch.ops.smelt_test.linear_recurrence(a * 1, b), a, b, atol=1e-5, rtol=1e-5)
    finally:
        LOWERINGS.pop(op)


def _slice_add(v):
    v[..., 1:].add_(2)
    return v.clone()


@pytest.mark.parametrize("read", [
    _slice_add,
    lambda v: torch.nn.functional.pad(v, (1, 2)) * 3,
    lambda v: torch.cat([v[..., 1:], v[..., :1] * 2], -1),
    lambda v: torch.where(v > 1, v, -v),
], ids=["slice_add_", "pad", "cat_of_slices", "where"])
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "logcumsumexp"])
def test_scan_read_under_a_mask_in_the_same_kernel(device, check, op, read):
    # A kernel reading a scan it computes inside masked() (a slice_scatter's, a pad's, a cat's
    # piece) re-ran the scan with the reader's mask on its loads: cumsum then v[1:].add_(2) gave
    # 1 + 2 where eager has 3 + 2 (found by the fuzzer under Triton).
    def fn(x):
        v = getattr(torch, op)(x, -1)
        return read(v[0] if isinstance(v, tuple) else v)
    check(fn, torch.rand(7, device=device) + 0.5)
    check(fn, torch.rand(3, 7, device=device) + 0.5)
