"""Graph-level edge cases: output structure, aliasing, mutation, constants, fallbacks."""

import pytest
import torch


def test_multiple_outputs_of_different_shapes_and_dtypes(device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x: (x + 1, x.sum(dim=0), x > 0, x.argmax(dim=1), (x * 2).to(torch.float16)), x)


def test_tuple_output_containing_none(device, check):
    x = torch.randn(17, 33, device=device)
    actual, _ = check(lambda x: (x * 2, None, x.exp()), x)
    assert actual[1] is None


def test_dict_and_list_outputs(device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x: {"a": x.relu(), "b": [x.sin(), x.cos()]}, x)


def test_returns_input_unchanged(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    a, b = compile_fn(lambda x: (x, x * 3))(x)
    assert a is x or a.data_ptr() == x.data_ptr()
    assert_close(b, x * 3)


def test_same_value_returned_twice(device, check):
    x = torch.randn(17, 33, device=device)
    actual, _ = check(lambda x: (lambda y: (y, y))(x.tanh()), x)
    assert actual[0].data_ptr() == actual[1].data_ptr()


def test_inplace_add_mutates_input_like_eager(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    x_ref = x.clone()

    def fn(x):
        x.add_(1)
        return x * 2

    out = compile_fn(fn)(x)
    out_ref = fn(x_ref)
    assert_close(x, x_ref)  # the input itself was updated
    assert_close(out, out_ref)


@pytest.mark.parametrize("shape", [(), (3,), (17, 33)])
def test_a_value_read_before_an_inplace_update_sees_the_old_input(shape, device, compile_fn, assert_close):
    # The output is realized after the graph's copy_ into x; computed from x, it must still read
    # the old contents, even fused into the kernel that writes the new ones.
    x = torch.randn(shape, device=device)
    y = torch.randn(shape, device=device)
    x_ref = x.clone()

    def fn(x, y):
        before = x * 3
        x.add_(y * 2).clamp_(max=1.5)
        return before.sin() + y

    out = compile_fn(fn)(x, y)
    out_ref = fn(x_ref, y)
    assert_close(x, x_ref)
    assert_close(out, out_ref)


def test_inplace_mutation_of_input_slice(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    y = torch.randn(33, device=device)
    x_ref = x.clone()

    def fn(x, y):
        x[3].mul_(y)
        x[:, 0] = 0.0
        return x.sum(dim=1)

    out = compile_fn(fn)(x, y)
    out_ref = fn(x_ref, y)
    assert_close(x, x_ref)
    assert_close(out, out_ref, atol=1e-5, rtol=1e-5)


def test_inplace_mutation_returning_the_mutated_input(device, compile_fn, assert_close):
    x = torch.randn(17, 33, device=device)
    x_ref = x.clone()

    def fn(x):
        return x.mul_(2).clamp_(min=0)

    out = compile_fn(fn)(x)
    out_ref = fn(x_ref)
    assert_close(x, x_ref)
    assert_close(out, out_ref)
    assert out.data_ptr() == x.data_ptr()


def test_closure_constant_tensor(device, check):
    table = torch.linspace(-1, 1, 33, device=device)
    x = torch.randn(17, 33, device=device)
    check(lambda x: x * table + table.sum(), x)


class WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.arange(33, dtype=torch.float32) / 10)

    def forward(self, x):
        return torch.sigmoid(x) * self.scale


def test_module_buffer_is_used(device, compile_fn, assert_close):
    m = WithBuffer().to(device)
    x = torch.randn(17, 33, device=device)
    assert_close(compile_fn(m)(x), m(x))


def test_buffer_mutation_in_forward(device, compile_fn, assert_close):
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(33))

        def forward(self, x):
            self.total.add_(x.sum(dim=0))
            return x - self.total

    m, m_ref = Counter().to(device), Counter().to(device)
    compiled = compile_fn(m)
    for _ in range(2):
        x = torch.randn(17, 33, device=device)
        assert_close(compiled(x), m_ref(x), atol=1e-5, rtol=1e-5)
    assert_close(m.total, m_ref.total, atol=1e-5, rtol=1e-5)


UNLOWERED = {
    "bessel_j0": (lambda x: torch.special.bessel_j0(x) + 1, lambda d: torch.randn(17, 33, device=d) * 3),
    "linalg_det": (lambda x: torch.linalg.det(x * 2) * 2, lambda d: torch.randn(5, 4, 4, device=d)),
    "sort_values": (lambda x: torch.sort(x.exp(), dim=-1).values - 1, lambda d: torch.randn(17, 33, device=d)),
    "cumsum": (lambda x: torch.cumsum(x * 2, dim=1).sin(), lambda d: torch.randn(17, 33, device=d)),
    "topk": (lambda x: torch.topk(x + 1, 3, dim=-1).values, lambda d: torch.randn(17, 33, device=d)),
}


@pytest.mark.parametrize("name", sorted(UNLOWERED))
def test_exotic_op_without_lowering_still_correct(name, device, check):
    fn, make = UNLOWERED[name]
    check(fn, make(device), atol=1e-4, rtol=1e-4)


def test_unlowered_op_is_recorded_as_fallback(device, compile_fn, observe, assert_close):
    x = torch.randn(5, 4, 4, device=device)
    fn = lambda x: torch.linalg.det(x * 2) + 1  # noqa: E731
    assert_close(compile_fn(fn)(x), fn(x), atol=1e-4, rtol=1e-4)
    fallbacks = [op for g in observe.compiled_graphs() for op in g.fallback_ops]
    assert all(isinstance(op, str) for op in fallbacks)
    assert any("det" in op for op in fallbacks), fallbacks


def test_zero_dim_input_and_output(device, check):
    x = torch.tensor(0.75, device=device)
    y = torch.randn(17, device=device)
    actual, _ = check(lambda x, y: (x * 2 + 1, (y * x).sum()), x, y)
    assert actual[0].dim() == 0 and actual[1].dim() == 0


def test_empty_tensor(device, check):
    x = torch.randn(0, 33, device=device)
    actual, _ = check(lambda x: (x * 2 + 1, x.sum(dim=0)), x)
    assert actual[0].shape == (0, 33)


def test_python_scalar_argument(device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x, s: x * s + s, x, 0.3)


def test_int_and_bool_inputs_together(device, check):
    x = torch.randn(17, 33, device=device)
    i = torch.randint(0, 5, (17, 33), device=device)
    m = torch.rand(17, 33, device=device) > 0.5
    check(lambda x, i, m: torch.where(m, x * i, -i.float()), x, i, m)


@pytest.mark.parametrize("fn", [
    lambda x, e: (lambda y: (y, torch.cat([y, e])))(x * 2),
    lambda x, e: (lambda y: (y, torch.cat([e, y, e])))(x[torch.tensor([2, 0], device=x.device)]),
], ids=["cat_with_empty", "cat_with_two_empties"])
def test_outputs_eager_makes_anew_are_distinct_tensors(compile_fn, device, fn):
    # A cat of x and an empty tensor lowers to x itself; returned twice as one tensor, autograd took
    # the second output for the first (no grad_fn: the empty input's gradient was None), and a
    # write to one output would show in the other (found by the fuzzer).
    x = torch.randn(5, device=device)
    e = torch.randn(0, device=device, requires_grad=True)
    outs = compile_fn(fn)(x, e)
    assert outs[0].data_ptr() != outs[1].data_ptr()
    outs[1].sum().backward()
    expected = fn(x, e.detach().requires_grad_())
    torch.testing.assert_close(outs[1], expected[1])
    assert e.grad is not None and e.grad.shape == (0,)


_IDENTITIES = {  # ops eager answers with a new tensor that a lowering may find equal to an input
    "cat_with_empty": lambda x, e: torch.cat([e, x]),
    "cat_of_one": lambda x, e: torch.cat([x]),
    "stack_unsqueezed": lambda x, e: torch.stack([x])[0],
    "clone": lambda x, e: x.clone(),
    "to_copy": lambda x, e: x.to(x.dtype, copy=True),
    "mul_one": lambda x, e: x * 1,
    "add_zero": lambda x, e: x + 0,
    "pow_one": lambda x, e: x.pow(1),
    "floor_of_int": lambda x, e: x.long().floor(),
    "pad_nothing": lambda x, e: torch.nn.functional.pad(x, (0, 0)),
    "repeat_once": lambda x, e: x.repeat(1),
    "roll_zero": lambda x, e: x.roll(0),
    "sum_size_one": lambda x, e: x.unsqueeze(0).sum(0),
    "cumsum_size_one": lambda x, e: x.unsqueeze(0).cumsum(0)[0],
    "masked_fill_nothing": lambda x, e: x.masked_fill(x != x, 0.0),
    "where_same": lambda x, e: torch.where(x > 0, x, x),
}


@pytest.mark.parametrize("name", list(_IDENTITIES))
def test_a_new_tensor_in_eager_is_not_the_input_itself(compile_fn, device, name):
    """Found by the fuzzer (seed 2802): `v = cat([empty, x]); x.clamp_(...)` returned x itself as v,
    so the graph's write into x showed in v. An output that eager's op makes anew must not share an
    input's memory: neither the graph's own write to the input nor the caller's to the output may
    show in the other."""
    op = _IDENTITIES[name]

    def fn(x, e):
        v = op(x, e)
        x.clamp_(min=-0.5)
        return v

    x, e = torch.tensor([-1.0, 2.0, -3.0], device=device), torch.empty(0, device=device)
    expected = fn(x.clone(), e)
    got_x = x.clone()
    got = compile_fn(fn)(got_x, e)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_x, x.clamp(min=-0.5))
    outside = x.clone()
    out = compile_fn(lambda x, e: op(x, e))(outside, e)
    out.add_(100)  # the caller's write to the result
    torch.testing.assert_close(outside, x)


@pytest.mark.parametrize("name", list(_IDENTITIES))
def test_a_new_tensor_and_its_view_share_memory_as_in_eager(compile_fn, device, name):
    """Fuzz seed 2807: `v = torch.cat([x]); return v, v[..., 1:]` came back as two copies (the
    output rule copied each out of x's memory), so a write to v no longer showed in its view.
    Each output shares memory exactly where eager's does."""
    from smelt.tools.fuzz.runner import shared_memory
    op = _IDENTITIES[name]

    def fn(x, e):
        v = op(x, e)
        return v, v[1:]

    x, e = torch.tensor([-1.0, 2.0, -3.0], device=device), torch.empty(0, device=device)
    want, mine = fn(x, e), x.clone()
    got = compile_fn(fn)(mine, e)
    assert shared_memory(got, [mine, e]) == shared_memory(want, [x, e])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("fn", [
    lambda x, y: x.add_(1),
    lambda x, y: x.copy_(y),
    lambda x, y: (x.mul_(2), x * 3),
    lambda x, y: x[1:].clamp_(min=0),
], ids=["add_", "copy_", "mul_and_a_new_one", "a_view_written"])
def test_an_in_place_result_is_its_inputs_memory_as_in_eager(compile_fn, device, fn, caplog):
    """The output rule for new tensors took `copy_` (whose result is its first argument, as every
    in-place op's is) for an op making one, and copied it: a kernel and a buffer for nothing
    (AOTAutograd hands the caller the input itself)."""
    import logging
    from smelt.tools.fuzz.runner import shared_memory
    caplog.set_level(logging.DEBUG, logger="smelt.lowering")
    x, y = torch.tensor([-1.0, 2.0, -3.0], device=device), torch.tensor([4.0, 5.0, 6.0], device=device)
    want_x = x.clone()
    want = fn(want_x, y)
    mine = x.clone()
    got = compile_fn(fn)(mine, y)
    want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
    assert shared_memory(got, [mine, y]) == shared_memory(want, [want_x, y])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(mine, want_x)
    assert "eager's op makes it anew" not in caplog.text
