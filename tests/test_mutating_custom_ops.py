"""Custom ops that mutate their arguments (`torch.library.custom_op(..., mutates_args=...)`):
functionalization hands them to smelt as auto_functionalized(_v2), which runs the op on clones of
the bases it mutates and returns the new bases; a mutated graph input is written back by copy_."""
import pytest
import torch
import torch._inductor.config


@pytest.fixture(autouse=True, params=["v2", "v1"])
def functional_form(request):
    """auto_functionalized_v2 by default; auto_functionalized (v1) where a torch setting asks for it."""
    with torch._inductor.config.patch(enable_auto_functionalized_v2=request.param == "v2"):
        yield request.param


@torch.library.custom_op("smelt_test::write_double", mutates_args={"out"})
def write_double(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 2)


@torch.library.custom_op("smelt_test::add_into", mutates_args={"y"})
def add_into(x: torch.Tensor, y: torch.Tensor) -> None:
    y.add_(x)


@torch.library.custom_op("smelt_test::add_into_and_scale", mutates_args={"y"})
def add_into_and_scale(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y.add_(x)
    return x * 3


@add_into_and_scale.register_fake
def _(x, y):
    return torch.empty_like(x)


@torch.library.custom_op("smelt_test::swap_halves", mutates_args={"a", "b"})
def swap_halves(a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    old = a.clone()
    a.copy_(b * scale)
    b.copy_(old - 1)


@torch.library.custom_op("smelt_test::scale_each", mutates_args={"xs"})
def scale_each(xs: list[torch.Tensor], factor: float) -> None:
    for k, x in enumerate(xs):
        x.mul_(factor + k)


def test_mutates_a_list_of_tensors(compile_fn, assert_close, device):
    def f(a, b):
        c = b.exp()
        scale_each([a, c[1:], b[:, 0]], 2.0)
        return a - 1, c.sum(0)
    a, b = torch.randn(5, device=device), torch.randn(4, 5, device=device)
    a_eager, a_compiled, b_eager, b_compiled = a.clone(), a.clone(), b.clone(), b.clone()
    expected = f(a_eager, b_eager)
    actual = compile_fn(f)(a_compiled, b_compiled)
    assert_close(actual, expected)
    assert_close((a_compiled, b_compiled), (a_eager, b_eager))


def test_mutates_a_temporary(check, device):
    def f(x):
        out = torch.empty_like(x)
        write_double(x + 1, out)
        return out + 1
    check(f, torch.randn(8, device=device))


def test_mutates_a_graph_input(compile_fn, assert_close, device):
    def f(x, y):
        add_into(x * 2, y)
        return y + x
    x, y = torch.randn(4, 5, device=device), torch.randn(4, 5, device=device)
    y_eager, y_compiled = y.clone(), y.clone()
    expected = f(x, y_eager)
    actual = compile_fn(f)(x, y_compiled)
    assert_close(actual, expected)
    assert_close(y_compiled, y_eager)  # the input itself is updated, as eager updates it


@pytest.mark.parametrize("dynamic", [False, True])
def test_mutates_a_slice(compile_fn, assert_close, device, dynamic):
    def f(x, y):
        buf = torch.zeros(12, 5, device=device)
        write_double(x, buf[3:7])
        add_into((x + 1)[:, :2], y[1:5, 2:4])
        return buf * 1, y.sum(0)
    x, y = torch.randn(4, 5, device=device), torch.randn(6, 8, device=device)
    y_eager, y_compiled = y.clone(), y.clone()
    expected = f(x, y_eager)
    actual = compile_fn(f, dynamic=dynamic)(x, y_compiled)
    assert_close(actual, expected)
    assert_close(y_compiled, y_eager)


def test_mutates_an_input_slice_through_as_strided(compile_fn, assert_close, device):
    def f(x, y):
        add_into(x, y.t()[1])  # a strided row of a transposed input
        return y * 2
    x, y = torch.randn(6, device=device), torch.randn(6, 4, device=device)
    y_eager, y_compiled = y.clone(), y.clone()
    expected = f(x, y_eager)
    actual = compile_fn(f)(x, y_compiled)
    assert_close(actual, expected)
    assert_close(y_compiled, y_eager)


def test_mutates_and_returns(compile_fn, assert_close, device):
    def f(x, y):
        z = add_into_and_scale(x.sin(), y)
        return z + y, y.exp()
    x, y = torch.randn(16, device=device), torch.randn(16, device=device)
    y_eager, y_compiled = y.clone(), y.clone()
    expected = f(x, y_eager)
    actual = compile_fn(f)(x, y_compiled)
    assert_close(actual, expected)
    assert_close(y_compiled, y_eager)


def test_two_mutated_args(compile_fn, assert_close, device):
    def f(a, x):
        b = x.cos()
        swap_halves(a, b, 0.5)
        return a + 1, b * b
    a, x = torch.randn(3, 7, device=device), torch.randn(3, 7, device=device)
    a_eager, a_compiled = a.clone(), a.clone()
    expected = f(a_eager, x)
    actual = compile_fn(f)(a_compiled, x)
    assert_close(actual, expected)
    assert_close(a_compiled, a_eager)


def test_values_read_before_the_mutation_keep_old_contents(compile_fn, assert_close, device):
    def f(x, y):
        before = y * 3  # read before the op: the old y
        add_into(x, y)
        return before, y + 0
    x, y = torch.randn(8, device=device), torch.randn(8, device=device)
    y_eager, y_compiled = y.clone(), y.clone()
    expected = f(x, y_eager)
    actual = compile_fn(f)(x, y_compiled)
    assert_close(actual, expected)
    assert_close(y_compiled, y_eager)


def test_training_through_a_mutating_op(compile_fn, assert_close, device):
    def f(w, x):
        scale = torch.empty_like(x)
        write_double(x.detach().abs() + 1, scale)  # no autograd formula: used as a constant, as eager does
        return ((w * x).tanh() * scale).sum()
    w = torch.randn(4, 6, device=device)
    x = torch.randn(4, 6, device=device)
    w_e, w_c = w.clone().requires_grad_(), w.clone().requires_grad_()
    expected = f(w_e, x)
    expected.backward()
    actual = compile_fn(f)(w_c, x)
    actual.backward()
    assert_close(actual, expected)
    assert_close(w_c.grad, w_e.grad)
