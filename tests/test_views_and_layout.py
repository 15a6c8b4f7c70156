"""Broadcasting, non-contiguous inputs, and outputs that are views."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_broadcast_column_plus_row(device, check):
    a = torch.randn(17, 1, device=device)
    b = torch.randn(1, 33, device=device)
    actual, _ = check(lambda a, b: a + b * 2, a, b)
    assert actual.shape == (17, 33)


def test_broadcast_vector_over_matrix(device, check):
    v = torch.randn(33, device=device)
    m = torch.randn(17, 33, device=device)
    check(lambda v, m: (v + m, m * v - v), v, m)


def test_broadcast_3d_three_ways(device, check):
    a = torch.randn(5, 1, 33, device=device)
    b = torch.randn(1, 7, 1, device=device)
    c = torch.randn(33, device=device)
    actual, _ = check(lambda a, b, c: torch.where(a > b, a * c, b - c), a, b, c)
    assert actual.shape == (5, 7, 33)


def test_broadcast_scalar_tensor_0d(device, check):
    s = torch.tensor(1.5, device=device)
    x = torch.randn(17, 33, device=device)
    check(lambda s, x: x * s + s, s, x)


def test_transposed_input(device, check):
    x = torch.randn(33, 17, device=device)
    y = torch.randn(17, 33, device=device)
    xt = x.t()
    assert not xt.is_contiguous()
    check(lambda xt, y: xt * 2 + y, xt, y)


def test_transposed_input_reduction(device, check):
    x = torch.randn(33, 17, device=device).t()
    check(lambda x: (x.sum(dim=-1), x.amax(dim=0), torch.softmax(x, dim=-1)), x, atol=1e-5, rtol=1e-5)


def test_step_sliced_input(device, check):
    base = torch.randn(17, 66, device=device)
    x = base[:, ::2]
    assert x.shape == (17, 33) and not x.is_contiguous()
    check(lambda x: torch.exp(x) - x, x)


def test_offset_sliced_input(device, check):
    base = torch.randn(20, 40, device=device)
    x = base[3:, 5:38]  # nonzero storage offset
    check(lambda x: (x + 1).sum(dim=0), x, atol=1e-5, rtol=1e-5)


def test_expanded_input(device, check):
    x = torch.randn(17, 1, device=device).expand(17, 33)
    y = torch.randn(17, 33, device=device)
    assert x.stride() == (1, 0)
    check(lambda x, y: x * y + x, x, y)


def test_permuted_3d_input(device, check):
    x = torch.randn(33, 5, 7, device=device).permute(1, 2, 0)
    check(lambda x: torch.tanh(x) * 3 + x.mean(dim=1, keepdim=True), x, atol=1e-5, rtol=1e-5)


def test_channels_last_input(device, check):
    x = torch.randn(2, 5, 7, 9, device=device).to(memory_format=torch.channels_last)
    check(lambda x: torch.relu(x) + x.mean(dim=1, keepdim=True), x, atol=1e-5, rtol=1e-5)


def test_returns_transpose_of_computed_value(device, check):
    x = torch.randn(17, 33, device=device)
    actual, _ = check(lambda x: (x * 2 + 1).t(), x)
    assert actual.shape == (33, 17)


def test_returns_view_and_base_of_computed_value(device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x: (lambda y: (y, y[2:5], y.view(33, 17), y.unsqueeze(0)))(x.sin()), x)


def test_returns_view_of_input_aliases_input(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    out = compile_fn(lambda x: x[1:])(x)
    assert_close(out, x[1:])
    # the output must alias the input, exactly like eager
    assert out.data_ptr() == x[1:].data_ptr()
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_returns_input_view_and_computed_value(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    v, y = compile_fn(lambda x: (x.t(), x.cos() + 1))(x)
    assert_close(v, x.t())
    assert_close(y, x.cos() + 1)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_reshape_view_chain(device, check):
    x = torch.randn(4, 6, 35, device=device)
    check(lambda x: (x.reshape(24, 35) * 2).view(4, 6, 5, 7).permute(0, 3, 1, 2).sum(dim=-1), x, atol=1e-5, rtol=1e-5)


def test_flatten_after_transpose_needs_copy(device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x: (x + 1).t().reshape(-1)[::3], x)


def test_integer_indexing_and_select(device, check):
    x = torch.randn(5, 7, 33, device=device)
    check(lambda x: x[:, 2] * x[1].sum(dim=0) + x.select(2, 4).unsqueeze(-1).sum(), x, atol=1e-5, rtol=1e-5)


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.integers(2, 40),
    cols=st.integers(2, 40),
    transpose=st.booleans(),
    step=st.integers(1, 3),
)
def test_random_shapes_and_strides_pointwise(rows, cols, transpose, step, device, check):
    torch._dynamo.reset()
    base = torch.randn(rows, cols * step, device=device)
    x = base[:, ::step]
    if transpose:
        x = x.t()
    y = torch.randn(x.shape[-1], device=device)
    check(lambda x, y: torch.sigmoid(x) * y + x.sum(dim=0, keepdim=True), x, y, atol=1e-5, rtol=1e-5)


def test_output_takes_eagers_strides_for_a_transposed_result(device, check):
    actual, expected = check(lambda x: x.t() * 2, torch.randn(5, 7, device=device))
    assert actual.stride() == expected.stride()
    actual, expected = check(lambda x: x.permute(2, 0, 1) + 1, torch.randn(3, 4, 6, device=device))
    assert actual.stride() == expected.stride()


def test_dynamic_reshape_merging_dims_beside_a_size_one_dim_keeps_strides(device, compile_fn, assert_close):
    # q @ k^T over one query (a decode step): q's (B, H, 1, D) views as (B*H, 1, D) for bmm. Its
    # storage index simplified to s89*(v0 + v1) + v2, whose unexpanded form gave v0 stride 0.
    fn = lambda q, k: q @ k.transpose(-1, -2)  # noqa: E731
    compiled = compile_fn(fn, dynamic=True)
    for queries in (1, 3):
        q, k = torch.randn(2, 4, queries, 64, device=device), torch.randn(2, 4, 5, 64, device=device)
        assert_close(compiled(q, k), fn(q, k))


# A store whose every lane writes one fixed element: Triton printed tl.broadcast_to of a Python
# integer (only 0 was special-cased), which neither the interpreter nor the compiler takes.
FIXED_ELEMENT_WRITES = {
    "as_strided_scatter_at_1": lambda x, v: torch.as_strided_scatter(x, v[:1], (1,), (2,), 1),
    "as_strided_scatter_at_5": lambda x, v: torch.as_strided_scatter(x, v[:1].view(1, 1), (1, 1), (3, 1), 5),
    "select_scatter_at_2": lambda x, v: torch.select_scatter(x, v[0], 0, 2),
    "index_put_one_position": lambda x, v: x.index_put((torch.tensor([3], device=x.device),), v[:1], accumulate=True),
}


@pytest.mark.parametrize("name", sorted(FIXED_ELEMENT_WRITES))
def test_a_write_of_one_fixed_element(name, device, check):
    check(FIXED_ELEMENT_WRITES[name], torch.randn(6, device=device), torch.randn(2, device=device))


def test_the_gradient_of_a_one_element_strided_view(device, compile_fn, assert_close):
    x = torch.randn(2, device=device, requires_grad=True)

    def fn(x):
        return x.clone(memory_format=torch.contiguous_format).as_strided((1,), (2,), 1) * 3
    (actual,) = torch.autograd.grad(compile_fn(fn)(x).sum(), x)
    (expected,) = torch.autograd.grad(fn(x).sum(), x)
    assert_close(actual, expected)


def test_reshape_chains_keep_index_expressions_small(device, check):
    # Attention-style head splits and merges, inlined through pointwise ops layer after layer. Each
    # reshape once read the whole flattened index of the one before it: the expressions nested a
    # level per reshape and sympy took 15 s over 3 layers, minutes over 4 (OPT at real size never
    # finished compiling). Dim-group indexing keeps them one digit deep.
    import time

    def fn(x):
        for _ in range(4):
            x = (x.view(2, 16, 12, 64).transpose(1, 2) * 1.5).transpose(1, 2).reshape(2, 16, 768) + 1
            x = x.view(2, 16, 12, 64).permute(0, 2, 1, 3).reshape(2, 12 * 16, 64).sin()
            x = x.view(2, 12, 16, 64).transpose(1, 2).reshape(2, 16, 768)
        return x
    start = time.perf_counter()
    check(fn, torch.randn(2, 16, 768, device=device))
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("old, new", [
    ((2, 12, 8), (2, 12, 2, 4)), ((2, 12, 2, 4), (2, 12, 8)), ((2, 6), (4, 3)), ((1, 6, 1), (6,)),
    ((6,), (1, 2, 1, 3)), ((6, 4), (4, 6)), ((0, 5), (5, 0)), ((3, 4, 5), (60,)), ((60,), (5, 3, 4)),
])
def test_reshape_indexer_reads_the_flat_position(old, new):
    # Each index of the reshape reads the element at the same row-major position of its input.
    import itertools

    import sympy

    from smelt.symbolic import flat_index, reshape_indexer
    reindex = reshape_indexer(old, new)
    if reindex is None:
        return  # the caller reads through the flat index instead
    for index in itertools.product(*[range(s) for s in new]):
        old_index = [int(sympy.sympify(e)) for e in reindex([sympy.Integer(i) for i in index])]
        assert all(0 <= i < s for i, s in zip(old_index, old))
        assert flat_index(old_index, old) == flat_index(list(index), new)


@pytest.mark.parametrize("shape", [(1, 2), (3, 4), (2, 3, 5)])
def test_a_value_saved_for_the_backward_keeps_its_gapped_traced_strides(shape, device, compile_fn, assert_close):
    # A fill through a view of a strided input gives a value with the input's strides (gaps between
    # elements); the backward reads the saved value with those strides, so the forward must produce
    # them, not a dense copy (CPU fuzzer: the RMSNorm weight's gradient read the gaps).
    def fn(x, w):
        x[..., ::2].masked_fill_(torch.ones((), dtype=torch.bool, device=x.device), 3)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def run(f):
        wide = torch.randn(*shape[:-1], 2 * shape[-1], device=device)
        torch.manual_seed(0)
        x, w = wide.clone()[..., ::2], torch.randn(shape[-1], device=device, requires_grad=True)
        out = f(x, w)
        out.sum().backward()
        return out, w.grad, x

    torch.manual_seed(1)
    expected = run(fn)
    torch.manual_seed(1)
    actual = run(compile_fn(fn))
    for a, e in zip(actual, expected):
        assert_close(a, e)


def _add_into_strided_slices(x, y):
    out = x.clone()
    out[:, ::2, 3:, ::3].add_(y)  # every slice of a size-1 dim folds its test to a 0-d value
    return out


def _add_into_one_slice(x, y):
    out = x.clone()
    out[:, :, 3:].add_(y)
    return out


@pytest.mark.parametrize("fn", [_add_into_strided_slices, _add_into_one_slice])
def test_a_scatter_whose_masks_are_all_0d(fn, device, check):
    # Fuzz finding: Triton's interpreter broadcast a mask of 0-d bools to a block as int32 data,
    # which its load refused ("mask has unsupported dtype").
    check(fn, torch.randn(2, 1, 1, 1, device=device), torch.randn(2, 1, 1, 1, device=device))


@pytest.mark.parametrize("offset", [None, 0, 2])
def test_as_strided_of_a_view_reaches_past_the_views_elements(device, compile_fn, assert_close, offset):
    # as_strided reads the storage a view shares with its base: v[0, 0] holds 3 of v's 18 elements and
    # the read below takes 12 of them. The view alone was realized, the rest read out of bounds (1e12).
    def fn(a):
        v = (a * 2).clone()
        row = v[0, 1]
        return row.as_strided((6, 2), (2, 1)) if offset is None else row.as_strided((6, 2), (2, 1), offset)

    a = torch.randn(2, 3, 3, device=device)
    assert_close(compile_fn(fn)(a), fn(a))


def _through_a_transposed_update(x):
    v = x.clone()
    v.t().sub_(0.5)  # functionalized: permute(permute(v) - 0.5), whose eager strides are (1, 6)
    return v.as_strided((3,), (1,), 1)


def _through_a_contiguous_clone_of_it(x):
    v = x.clone()
    v.t().sub_(0.5)
    return v.clone(memory_format=torch.contiguous_format).as_strided((4,), (2,), 1)


def _of_a_permuted_product(x):
    return (x.t() * 3).as_strided((2, 3), (1, 2))  # the product keeps x.t()'s strides in eager


def _of_a_view_of_a_permuted_sum(x):
    return (x.t() + 1)[1:].as_strided((5,), (2,), 3)


@pytest.mark.parametrize("fn", [_through_a_transposed_update, _through_a_contiguous_clone_of_it,
                                _of_a_permuted_product, _of_a_view_of_a_permuted_sum])
def test_as_strided_of_a_computed_value_reads_it_in_eagers_strides(device, compile_fn, assert_close, fn):
    """as_strided addresses storage with the strides eager gave its value; smelt stores the values its
    kernels compute contiguously. A computed value eager laid out otherwise (an elementwise op keeps
    its permuted input's strides) is read through a copy in eager's strides. Found by the fuzzer
    (seed 4348, program 159): the transposed update's rows were read where eager's storage holds
    its columns."""
    x = torch.arange(12.0, device=device).reshape(2, 6)
    assert_close(compile_fn(fn)(x), fn(x))
    torch._dynamo.reset()
    dynamic = compile_fn(fn, dynamic=True)  # eager's strides symbolic (x's width)
    for width in (6, 7, 9):
        x = torch.arange(2.0 * width, device=device).reshape(2, width)
        assert_close(dynamic(x), fn(x))
