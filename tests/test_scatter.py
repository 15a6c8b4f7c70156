"""Writes through index tensors: scatter, scatter_reduce, index_put and friends, the *_scatter ops,
and embedding's backward. Compared with eager on real inputs, duplicates and negative indices
included; most cases must also run without any ATen fallback."""
import copy
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import inspects_triton_kernels, stops_like_eager_on_the_gpu


@pytest.fixture
def lowered(check, backend):
    """check(fn, *args), then (under smelt) that nothing ran through an ATen fallback."""
    def run(fn, *args, **kw):
        result = check(fn, *args, **kw)
        if backend == "smelt":
            import smelt.observe
            fallbacks = [op for g in smelt.observe.compiled_graphs() for op in g.fallback_ops]
            assert not fallbacks, f"ran in ATen: {fallbacks}"
        return result
    return run


def _values(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.randn(shape, device=device, dtype=dtype)
    return torch.randint(-20, 20, shape, device=device, dtype=dtype)


# ---------------------------------------------------------------- scatter family


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_src_and_value(device, lowered, dim):
    x = torch.randn(5, 7, device=device)
    # Part of a permutation along dim: no duplicates, so a plain store is deterministic.
    index = torch.rand(5, 7, device=device).argsort(dim=dim)[:3, :4]
    src = torch.randn(6, 8, device=device)
    lowered(lambda x, i, s: (torch.scatter(x, dim, i, s), torch.scatter(x, dim, i, 2.5)), x, index, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.float64])
def test_scatter_add_with_duplicates(device, lowered, dtype):
    x = _values((4, 6), dtype, device)
    index = torch.randint(0, 6, (4, 9), device=device)  # 9 values into 6 slots per row: duplicates
    src = _values((4, 9), dtype, device)
    lowered(lambda x, i, s: torch.scatter_add(x, 1, i, s), x, index, src)
    lowered(lambda x, i, s: torch.scatter(x, 1, i, s, reduce="add"), x, index, src)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(device, lowered, reduce, include_self, dtype):
    x = _values((5, 4), dtype, device)
    index = torch.randint(0, 5, (7, 4), device=device)
    src = _values((7, 4), dtype, device)
    lowered(lambda x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self), x, index, src)


def test_scatter_multiply_many_duplicates(device, lowered):
    # Thousands of products into a few elements: the compare-and-swap loop retries until all land.
    x = torch.randn(7, device=device)
    index = torch.randint(0, 7, (3000,), device=device)
    src = 1 + 0.01 * torch.randn(3000, device=device)
    lowered(lambda x, i, s: (torch.scatter(x, 0, i, s, reduce="multiply"), x.scatter_reduce(0, i, s, "prod")),
            x, index, src, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce_narrow_types_combine_wider(device, lowered, dtype, reduce):
    # No atomics for these types: combined in float32 / int32 and cast back. Sums and products of
    # int8 wrap; the cast back wraps the same way.
    x = (torch.randn(5, 4, device=device) * 60).to(dtype)
    index = torch.randint(0, 5, (9, 4), device=device)
    src = (torch.randn(9, 4, device=device) * 60).to(dtype)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype.is_floating_point else {}
    if device.startswith("cuda") and dtype == torch.bool and reduce != "sum":
        pytest.skip("eager's CUDA scatter_reduce has no bool prod/amax/amin to compare with")
    lowered(lambda x, i, s: (x.scatter_reduce(0, i, s, reduce, include_self=True),
                             x.scatter_reduce(0, i, s, reduce, include_self=False)), x, index, src, **tol)


def test_integer_mean_without_atomic_runs_in_aten(device, check, backend):
    x = torch.randint(-100, 100, (5, 4), device=device, dtype=torch.int8)
    index = torch.randint(0, 5, (7, 4), device=device)
    src = torch.randint(-100, 100, (7, 4), device=device, dtype=torch.int8)
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "mean") + 1, x, index, src)
    if backend == "smelt":
        import smelt.observe
        assert any("scatter_reduce" in op for g in smelt.observe.compiled_graphs() for op in g.fallback_ops)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(device, lowered, reduce, include_self):
    x = torch.randn(4, 6, device=device)
    index = torch.tensor([0, 5, 2, 5, 5], device=device)
    source = torch.randn(4, 5, device=device)
    lowered(lambda x, i, s: x.index_reduce(1, i, s, reduce, include_self=include_self), x, index, source)


# ---------------------------------------------------------------- index_put


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_index_put_forms(device, lowered, accumulate, dtype):
    x = _values((6, 5, 4), dtype, device)
    rows = torch.tensor([0, -1, 3], device=device)  # negative counts from the end
    cols = torch.tensor([3, 1, -4], device=device)
    put = torch.ops.aten.index_put  # takes None for a dimension that is not indexed
    lowered(lambda x, r, c: (
        put(x, [r], torch.full((3, 5, 4), 3, dtype=dtype, device=device), accumulate),  # x[r] = v
        put(x, [None, c], torch.ones((), dtype=dtype, device=device), accumulate),  # x[:, c] = 1
        put(x, [None, None, c], torch.ones(6, 5, 3, dtype=dtype, device=device), accumulate),
        # Index tensors apart: the broadcast index dims come first in the written shape.
        put(x, [r, None, c[:, None]], torch.full((3, 3, 5), 2, dtype=dtype, device=device), accumulate),
    ), x, rows, cols)


def test_index_put_accumulate_duplicates_exact(device, lowered):
    x = torch.zeros(8, 3, device=device)
    idx = torch.tensor([1, 1, 1, 7, -1, 0, 1], device=device)
    v = torch.randn(7, 3, device=device)
    lowered(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), x, idx, v)


def test_index_put_inplace_on_input(device, compile_fn, assert_close):
    x = torch.randn(6, 3, device=device)
    idx = torch.tensor([5, 0, 2], device=device)

    def fn(x, i):
        x[i] += 1.5  # index, add, index_put_ on the input: the input itself is updated
        return x.sum()
    x_eager, x_compiled = x.clone(), x.clone()
    expected = fn(x_eager, idx)
    actual = compile_fn(fn)(x_compiled, idx)
    assert_close(actual, expected)
    assert_close(x_compiled, x_eager)


def test_index_put_boolean_mask_is_pointwise(device, lowered):
    x = torch.randn(5, 4, device=device)
    mask = torch.tensor([True, False, True, True, False], device=device)
    row = torch.randn(4, device=device)
    lowered(lambda x, m, r: (torch.index_put(x, (m,), r), torch.index_put(x, (m,), r, accumulate=True),
                             torch.index_put(x, (x > 0,), torch.tensor(0.0, device=device))), x, mask, row)


def test_index_add_copy_fill(device, lowered):
    x = torch.randn(5, 6, device=device)
    idx = torch.tensor([4, 0, 4, 2], device=device)
    src = torch.randn(5, 4, device=device)
    lowered(lambda x, i, s: (x.index_add(1, i, s, alpha=2), x.index_fill(1, i, -1.0)), x, idx, src)
    unique = torch.tensor([3, 0, 5, 1], device=device)
    lowered(lambda x, i, s: x.index_copy(1, i, s), x, unique, src)


@pytest.mark.parametrize("shape, dim", [((0, 5, 5), 0), ((8, 0), 1)])
@pytest.mark.parametrize("inplace", [False, True], ids=["index_add", "index_add_"])
def test_index_add_into_an_empty_destination(device, check, shape, dim, inplace):
    # ATen's index_add leaves a destination of 2+ dims without elements as it is, without reading
    # the indices; the decomposition's index_put checked them against the size 0 and its scatter
    # kernel raised (found by the fuzzer). A 1-D one raises in eager, and must in smelt too.
    if device != "cpu":
        pytest.skip("eager's CUDA index_add checks the index against the empty dim: a device-side assert")
    src_shape = list(shape)
    src_shape[dim] = 1
    x, src = torch.randn(shape, device=device), torch.randn(src_shape, device=device)
    idx = torch.tensor([0], device=device)
    if inplace:
        check(lambda x, i, s: x.clone().index_add_(dim, i, s) * 2, x, idx, src)
    else:
        check(lambda x, i, s: x.index_add(dim, i, s, alpha=2), x, idx, src)


@pytest.mark.parametrize("op", ["index_add", "index_put", "index_put_accumulate", "scatter", "scatter_add",
                                "index_copy", "index_fill", "setitem"])
def test_writes_into_an_empty_destination_raise_where_eager_does(device, compile_fn, op):
    # A kernel over a non-empty source whose destination has no elements: every index it stores
    # at is out of bounds, and eager raises (index_add only for a 1-D destination): so must smelt.
    if device != "cpu":
        return stops_like_eager_on_the_gpu(
            f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
            f"from test_scatter import _write_into_empty\nfn = lambda x, i, s: _write_into_empty({op!r}, x, i, s)\n"
            "x, i, s = torch.randn(0, device='cuda'), torch.tensor([0], device='cuda'), torch.randn(1, device='cuda')",
            "fn(x, i, s)")

    def fn(x, i, s):
        return _write_into_empty(op, x, i, s)
    x, i, s = torch.randn(0, device=device), torch.tensor([0], device=device), torch.randn(1, device=device)
    with pytest.raises(Exception):
        fn(x, i, s)
    with pytest.raises(Exception):
        compile_fn(fn)(x, i, s)


def _write_into_empty(op, x, i, s):
    if op == "index_add":
        return x.index_add(0, i, s)
    if op.startswith("index_put"):
        return x.index_put((i,), s, accumulate=op.endswith("accumulate"))
    if op in ("scatter", "scatter_add"):
        return getattr(x, op)(0, i, s)
    if op == "index_copy":
        return x.index_copy(0, i, s)
    if op == "index_fill":
        return x.index_fill(0, i, 1.0)
    y = x.clone()
    y[i] = s
    return y


def test_scatter_values_computed_in_scatter_kernel(device, lowered, kernel_count, observe):
    x = torch.randn(10, 8, device=device)
    idx = torch.tensor([9, 2, 2, 0], device=device)
    v = torch.randn(4, 8, device=device)
    lowered(lambda x, i, v: torch.index_put(x, (i,), v * 2, accumulate=True), x, idx, v)
    # One kernel copies x; one computes v * 2 and adds it in place.
    assert kernel_count() == 2
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    scatter_source = [s for s in graph.kernel_sources.values() if "atomic_add" in s]
    assert len(scatter_source) == 1 and "* 2.0" in scatter_source[0]


def test_reader_of_scattered_buffer_sees_every_write(device, lowered, kernel_count):
    # If the reader ran in the scatter's kernel it would see only its own lane's value.
    x = torch.zeros(16, device=device)
    idx = torch.tensor([3] * 16, device=device)
    v = torch.arange(16.0, device=device)
    lowered(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True) * 2 + v, x, idx, v)
    assert kernel_count() == 3


def test_index_put_accumulate_bfloat16(device, lowered):
    x = torch.randn(6, 4, device=device, dtype=torch.bfloat16)
    idx = torch.tensor([1, 1, 5], device=device)
    v = torch.randn(3, 4, device=device, dtype=torch.bfloat16)
    lowered(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), x, idx, v)


def test_index_put_dynamic_shapes(device, check):
    for n in (7, 11):
        x = torch.randn(n, 3, device=device)
        idx = torch.tensor([0, n - 1, 0], device=device)
        v = torch.randn(3, 3, device=device)
        check(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), x, idx, v,
              compile_kw={"dynamic": True})


# ---------------------------------------------------------------- embedding one tensor in another


def test_select_slice_diagonal_scatter(device, lowered):
    x = torch.randn(6, 7, device=device)
    lowered(lambda x: (torch.select_scatter(x, torch.ones(7, device=device), 0, -2),
                       torch.slice_scatter(x, torch.zeros(6, 3, device=device), 1, 1, 7, 2),
                       torch.slice_scatter(x, torch.zeros(2, 7, device=device), 0, -3, -1),
                       torch.diagonal_scatter(x, torch.arange(5.0, device=device), 2),
                       torch.diagonal_scatter(x, torch.arange(4.0, device=device), -2)), x)


def test_as_strided_scatter(device, lowered):
    x = torch.randn(4, 5, device=device)
    src = torch.randn(3, 2, device=device)
    lowered(lambda x, s: (torch.as_strided_scatter(x, s, (3, 2), (5, 2), 1),
                          torch.as_strided_scatter(x.t(), s, (3, 2), (1, 7), 2)), x, src)


def test_masked_scatter_correct(device, check):
    x = torch.randn(4, 5, device=device)
    mask = x > 0
    src = torch.randn(4, 5, device=device)
    check(lambda x, m, s: x.masked_scatter(m, s), x, mask, src)


# ---------------------------------------------------------------- training


def test_embedding_training_step_grads_match(device, compile_fn, assert_close, observe):
    ref = nn.Sequential(nn.Embedding(12, 8, padding_idx=0), nn.Linear(8, 3)).to(device)
    model = copy.deepcopy(ref)
    ids = torch.tensor([[1, 5, 5, 0], [11, 5, 2, 1]], device=device)  # repeats: grads accumulate
    target = torch.randint(0, 3, (2, 4), device=device)

    def loss_fn(model, ids, target):
        return F.cross_entropy(model(ids).flatten(0, 1), target.flatten())
    loss = compile_fn(loss_fn)(model, ids, target)
    loss.backward()
    ref_loss = loss_fn(ref, ids, target)
    ref_loss.backward()
    assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    for p, p_ref in zip(model.parameters(), ref.parameters()):
        assert_close(p.grad, p_ref.grad, atol=1e-5, rtol=1e-5)
    fallbacks = [op for g in observe.compiled_graphs() for op in g.fallback_ops]
    assert not any("index_put" in op or "embedding" in op for op in fallbacks), fallbacks


def test_index_put_into_an_empty_tensor_and_its_gradient(device, compile_fn, assert_close):
    # The backward sums the gradient at the (no) indices: its rows are empty, and the index it
    # reads per row was checked against a size of 0 (and read from an empty buffer) all the same.
    def fn(x, idx, v):
        y = x.clone()
        y.index_put_((idx,), v)
        return y
    x = torch.randn(0, 1, 2, device=device)
    idx = torch.zeros(0, dtype=torch.int64, device=device)
    v = torch.randn(1, device=device, requires_grad=True)
    out = compile_fn(fn)(x, idx, v)
    assert_close(out, fn(x, idx, v))
    (actual,) = torch.autograd.grad(out.sum() + v.sum() * 0, v)
    (expected,) = torch.autograd.grad(fn(x, idx, v).sum() + v.sum() * 0, v)
    assert_close(actual, expected)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("form", ["value", "src"])
def test_one_position_per_line_scatter_is_one_pointwise_kernel(device, lowered, observe, dim, form):
    """An index naming one position in each line of x along dim (a one-hot gradient) is a select:
    fused with what reads it, nothing stored and scattered into first."""
    x = torch.randn(4, 7, 5, device=device)
    shape = [4, 7, 5]
    shape[dim] = 1
    idx = torch.randint(0, x.shape[dim], shape, device=device)
    src = torch.randn(4, 7, 5, device=device)

    def f(x, idx, src):
        filled = torch.zeros_like(x).scatter(dim, idx, -1.0 if form == "value" else src)
        return (filled * x).exp()

    lowered(f, x, idx, src)
    (graph,) = observe.compiled_graphs()
    assert len(graph.kernel_names) == 1, graph.kernel_names


def test_a_one_hot_read_on_both_sides_of_a_reduction_is_recomputed_not_stored(device, check, observe):
    """Cross-entropy's backward over a padded vocabulary (BERT's MLM head): the one-hot gradient is
    summed along its rows by one kernel and read again, padded, by the next. Each recomputes it from
    the index; storing it wrote a float32 [4096, 30522] buffer (477 MiB at BERT's peak)."""
    from conftest import allocated_shapes
    x = torch.randn(6, 33, device=device)
    target = torch.randint(0, 33, (6, 1), device=device)

    def f(x, target):
        logp = x - x.logsumexp(1, keepdim=True)
        grad = torch.zeros_like(logp).scatter(1, target, -0.5)
        return F.pad(grad - logp.exp() * grad.sum(1, keepdim=True), [0, 3])

    check(f, x, target)
    (graph,) = observe.compiled_graphs()
    assert (6, 33) not in allocated_shapes(graph.wrapper_source), graph.wrapper_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("form", ["scatter_add", "sum", "sum_without_self"])
def test_one_position_per_line_sums_are_one_pointwise_kernel(device, lowered, observe, form, dtype):
    """A sum with one value per line (gather's backward scatter-adds into zeros) is x plus the value
    where the index names it: fused with what reads it, eager's values (half floats rounded once)."""
    x = (torch.randn(4, 7, 5, device=device) * 4).to(dtype)
    idx = torch.randint(0, 7, (4, 1, 5), device=device)
    src = (torch.randn(4, 7, 5, device=device) * 4).to(dtype)

    def f(x, idx, src):
        if form == "scatter_add":
            summed = x.scatter_add(1, idx, src)
        else:
            summed = x.scatter_reduce(1, idx, src, "sum", include_self=form == "sum")
        return summed * 2

    lowered(f, x, idx, src)
    (graph,) = observe.compiled_graphs()
    assert len(graph.kernel_names) == 1, graph.kernel_names


def test_gathers_backward_stores_no_scattered_gradient(device, compile_fn, assert_close, observe):
    """-log_softmax(x).gather(1, target): the backward scatter-adds the gradient into zeros of x's
    shape, read by the log-softmax backward's sum and then by its pointwise part: each recomputes
    it, and the one [6, 33] buffer the backward allocates is the gradient it returns."""
    from conftest import allocated_shapes
    x = torch.randn(6, 33, device=device, requires_grad=True)
    target = torch.randint(0, 33, (6, 1), device=device)

    def f(x, target):
        return -x.log_softmax(1).gather(1, target).mean()

    (expected,) = torch.autograd.grad(f(x, target), x)
    (actual,) = torch.autograd.grad(compile_fn(f)(x, target), x)
    assert_close(actual, expected)
    (backward,) = [g for g in observe.compiled_graphs() if g.kind == "backward"]
    assert allocated_shapes(backward.wrapper_source).count((6, 33)) == 1, backward.wrapper_source


def test_one_position_per_line_scatter_checks_its_index(device, compile_fn):
    if device != "cpu":
        pytest.skip("an out-of-bounds index stops the GPU (test_writes_into_an_empty_destination covers it)")
    x, idx = torch.randn(3, 4, device=device), torch.tensor([[1], [4], [0]], device=device)
    with pytest.raises(Exception):
        torch.zeros_like(x).scatter(1, idx, 1.0)
    with pytest.raises(Exception):
        compile_fn(lambda x, idx: torch.zeros_like(x).scatter(1, idx, 1.0) + x)(x, idx)
