"""dynamic=True: one compilation serves several input sizes."""

import os

import pytest
import torch
import torch.nn.functional as F

BATCHES = (4, 3, 5, 11)  # first call, then three more sizes


def _forward_graphs(observe):
    return [g for g in observe.compiled_graphs() if g.kind in ("inference", "forward")]


def _run_batches(fn, compiled, make_input, assert_close, **tol):
    for n in BATCHES:
        x = make_input(n)
        assert_close(compiled(x), fn(x), **tol)


def _pointwise(x):
    return torch.sigmoid(x * 2 + 1) - x


def test_dynamic_pointwise_compiles_once_across_batch_sizes(device, counting_backend, assert_close):
    compiled = torch.compile(_pointwise, backend=counting_backend, dynamic=True, fullgraph=True)
    _run_batches(_pointwise, compiled, lambda n: torch.randn(n, 33, device=device), assert_close)
    assert counting_backend.frame_count == 1


def test_dynamic_pointwise_makes_one_smelt_graph(device, compile_fn, observe, assert_close):
    compiled = compile_fn(_pointwise, dynamic=True)
    _run_batches(_pointwise, compiled, lambda n: torch.randn(n, 33, device=device), assert_close)
    assert len(_forward_graphs(observe)) == 1


def test_dynamic_both_dims_vary(device, compile_fn, assert_close):
    compiled = compile_fn(_pointwise, dynamic=True)
    for shape in [(4, 33), (3, 17), (11, 129), (5, 2)]:
        x = torch.randn(shape, device=device)
        assert_close(compiled(x), _pointwise(x))


def _softmax(x):
    return F.softmax(x, dim=-1)


def test_dynamic_softmax(device, counting_backend, assert_close):
    compiled = torch.compile(_softmax, backend=counting_backend, dynamic=True, fullgraph=True)
    for n, m in [(4, 33), (3, 129), (5, 17), (11, 300)]:
        x = torch.randn(n, m, device=device) * 3
        assert_close(compiled(x), _softmax(x), atol=1e-5, rtol=1e-5)
    assert counting_backend.frame_count == 1


def _sum_rows(x):
    return x.sum(dim=-1), x.sum(dim=0), x.amax()


def test_dynamic_sum_reduction(device, counting_backend, assert_close):
    compiled = torch.compile(_sum_rows, backend=counting_backend, dynamic=True, fullgraph=True)
    for n, m in [(4, 33), (3, 129), (11, 17), (5, 300)]:
        x = torch.randn(n, m, device=device)
        assert_close(compiled(x), _sum_rows(x), atol=1e-4, rtol=1e-4)
    assert counting_backend.frame_count == 1


def test_dynamic_reduction_and_softmax_make_one_smelt_graph(device, compile_fn, observe, assert_close):
    def fn(x):
        return _softmax(x), x.sum(dim=-1)

    compiled = compile_fn(fn, dynamic=True)
    _run_batches(fn, compiled, lambda n: torch.randn(n, 65, device=device), assert_close, atol=1e-5, rtol=1e-5)
    assert len(_forward_graphs(observe)) == 1


def test_dynamic_mlp(device, counting_backend, assert_close):
    model = torch.nn.Sequential(torch.nn.Linear(33, 20), torch.nn.ReLU(), torch.nn.Linear(20, 7)).to(device).eval()
    compiled = torch.compile(model, backend=counting_backend, dynamic=True, fullgraph=True)
    with torch.no_grad():
        _run_batches(model, compiled, lambda n: torch.randn(n, 33, device=device), assert_close, atol=1e-4, rtol=1e-4)
    assert counting_backend.frame_count == 1


def test_dynamic_broadcast_with_static_weight(device, counting_backend, assert_close):
    w = torch.randn(33, device=device)

    def fn(x, w):
        return F.layer_norm(x, (33,)) * w + x.mean()

    compiled = torch.compile(fn, backend=counting_backend, dynamic=True, fullgraph=True)
    for n in BATCHES:
        x = torch.randn(n, 33, device=device)
        assert_close(compiled(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    assert counting_backend.frame_count == 1


def test_a_loop_bound_from_an_argument_under_triton_36s_interpreter(monkeypatch, compile_fn, assert_close):
    # The H100 machine's Triton 3.6 interpreter took int() of a one-element array for
    # `range(0, rnumel, RBLOCK)`, which its NumPy refuses: every CPU reduction over a dynamic row
    # length failed to launch (smelt/runtime/interpreter_compat.py).
    if os.environ.get("SMELT_CPU_BACKEND") != "triton":
        pytest.skip("runs CPU kernels in Triton's interpreter")
    from triton.runtime import interpreter

    from smelt.runtime import interpreter_compat
    newest = interpreter._patch_lang_tensor

    def as_in_triton_36(tensor, scope):
        newest(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", as_in_triton_36)
    monkeypatch.setattr(interpreter_compat, "_installed", False)

    def fn(x):  # a kernel of its own: the fix is installed when an interpreted module first loads
        return torch.softmax(x * 0.375, -1)
    compiled = compile_fn(fn, dynamic=True)
    for rows, length in [(3, 7), (5, 9)]:
        x = torch.randn(rows, length)
        assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("dims", [1, 2])
def test_batch_norm_training_under_dynamic_shapes(device, compile_fn, dims):
    """The running variance's unbiased correction n / (n - 1) is a symbolic float when the batch is
    symbolic: the op reading it runs in ATen, the wrapper computing it (a kernel takes sizes as
    integers; printing it in one failed to compile, as every BatchNorm training step did)."""
    torch.manual_seed(0)
    make = torch.nn.BatchNorm1d if dims == 1 else torch.nn.BatchNorm2d
    ours, eager = make(8).to(device).train(), make(8).to(device).train()
    compiled = compile_fn(ours, dynamic=True)
    for batch in (16, 5, 33):
        x = torch.randn(batch, 8, *([6, 7] if dims == 2 else []), device=device)
        torch.testing.assert_close(compiled(x), eager(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.running_var, eager.running_var, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours.running_mean, eager.running_mean, atol=1e-6, rtol=1e-6)


SIZE_PRODUCTS_AS_VALUES = {  # values computed from a dynamic size n, past int32 at n = 70000
    "full": lambda x: torch.full((2,), x.shape[0] * x.shape[0] * 3, device=x.device) + x[:2, 0].long(),
    "full_past_2_to_40": lambda x: torch.full((2,), x.shape[0] * 2 ** 40, device=x.device),
    "arange_from_a_product": lambda x: torch.arange(x.shape[0] ** 2, x.shape[0] ** 2 + 4, device=x.device) + 1,
    "scaled_by_a_product": lambda x: x[:3, 0].long() * (x.shape[0] * x.shape[0]),
}


@pytest.mark.parametrize("name", sorted(SIZE_PRODUCTS_AS_VALUES))
def test_a_value_made_of_dynamic_sizes_is_computed_in_int64(device, compile_fn, name):
    # Size arguments are int32 in the kernels (Halide's parameters; Triton's type for a value under
    # 2**31), and products of them wrapped: n * n * 3 gave 1815098113 for 14700000001.
    fn = SIZE_PRODUCTS_AS_VALUES[name]
    compiled = compile_fn(fn, dynamic=True)
    for n in (9, 70000):
        x = torch.ones(n, 1, device=device)
        assert torch.equal(compiled(x), fn(x)), n
