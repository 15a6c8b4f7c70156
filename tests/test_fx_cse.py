"""Repeated ATen calls merged before lowering (lowering/fx_cse.py), and what must stay apart."""
import pytest
import torch
import torch.nn.functional as F

import smelt
from smelt.lowering.fx_cse import merge_common_subexpressions

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]


def _aten_graph(fn, *args):
    return torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)


def _count(gm, target):
    return sum(n.target is target for n in gm.graph.nodes)


def test_a_mask_converted_per_layer_is_converted_once():
    def layers(x, mask):
        for _ in range(4):  # as BERT's layers each turn the mask into additive form
            x = torch.softmax(x + torch.where(mask, 0.0, float("-inf")), -1) @ x
        return x
    x, mask = torch.randn(8, 8), torch.rand(8, 8) > 0.3
    mask[:, 0] = True
    gm = _aten_graph(layers, x, mask)
    assert _count(gm, torch.ops.aten.where.self) == 4
    assert merge_common_subexpressions(gm) >= 3
    assert _count(gm, torch.ops.aten.where.self) == 1
    torch.testing.assert_close(gm(x, mask), layers(x, mask))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(layers, backend="smelt")(x, mask), layers(x, mask))


def test_random_draws_stay_apart():
    gm = _aten_graph(lambda x: (F.dropout(x, 0.5, True) - F.dropout(x, 0.5, True)).abs().sum(), torch.ones(1000))
    merge_common_subexpressions(gm)
    assert gm(torch.ones(1000)) > 0  # two draws: their difference is not zero
    torch._dynamo.reset()
    f = torch.compile(lambda x: (F.dropout(x, 0.5, True) - F.dropout(x, 0.5, True)).abs().sum(), backend="smelt")
    assert f(torch.ones(1000)) > 0


def test_scalars_of_other_types_stay_apart():
    gm = _aten_graph(lambda x: ((x + 1) * 2, (x + 1.0) * 2, (x + True) * 2), torch.arange(4))
    merge_common_subexpressions(gm)
    a, b, c = gm(torch.arange(4))
    assert (a.dtype, b.dtype, c.dtype) == (torch.int64, torch.float32, torch.int64)


def test_zeros_of_either_sign_stay_apart():
    # 0.0 == -0.0 in Python, with one hash: keyed by value, 1 / (x * -0.0) was merged into 1 / (x * 0.0).
    fn = lambda x: (1 / (x * 0.0), 1 / (x * -0.0), 1 / torch.full_like(x, 0.0), 1 / torch.full_like(x, -0.0))  # noqa: E731
    x = torch.tensor([1.0, 2.0])
    gm = _aten_graph(fn, x)
    merge_common_subexpressions(gm)
    for actual, expected in zip(gm(x), fn(x)):
        assert torch.equal(actual, expected), (actual, expected)


def test_zeros_of_either_sign_stay_apart_inside_a_kernel(compile_fn):
    # Past smelt's CSE, Halide's own took x * -0.0 for x * 0.0: it compares float constants by value.
    def fn(x):
        return torch.stack([1 / (x * -0.0), 1 / (x * 0.0), x * 0.0 - 0.0, torch.full_like(x, -0.0) + x * 0.0])
    x = torch.tensor([1.0, 2.0, -3.0])
    actual, expected = compile_fn(fn)(x), fn(x)
    assert torch.equal(actual, expected) and torch.equal(actual.signbit(), expected.signbit()), (actual, expected)


def test_values_the_caller_sees_are_never_merged():
    # Eager returns two tensors: merged, they would share memory and a write to one would show in
    # the other. Through views too.
    def two(x):
        return x.exp().t(), x.exp().view(-1), x.sin(), x.sin()
    x = torch.randn(3, 3)
    torch._dynamo.reset()
    outs = torch.compile(two, backend="smelt")(x)
    storages = {o.untyped_storage().data_ptr() for o in outs}
    assert len(storages) == 4
    outs[0].zero_()
    outs[2].zero_()
    torch.testing.assert_close(outs[1], x.exp().view(-1))
    torch.testing.assert_close(outs[3], x.sin())


def test_a_repeated_chain_is_merged_whole_and_the_gradient_matches():
    def f(x, w):
        return (x @ w).relu().sum() + (x @ w).relu().sum()
    x, w = torch.randn(4, 5), torch.randn(5, 3, requires_grad=True)
    gm = _aten_graph(f, x, w.detach())
    merge_common_subexpressions(gm)
    assert _count(gm, torch.ops.aten.mm.default) == 1 and _count(gm, torch.ops.aten.relu.default) == 1
    torch._dynamo.reset()
    w2 = w.detach().clone().requires_grad_()
    torch.compile(f, backend="smelt")(x, w2).backward()
    f(x, w).backward()
    torch.testing.assert_close(w2.grad, w.grad)


def test_reads_on_either_side_of_a_write_stay_apart():
    # An ATen graph that writes in place (not functionalized): the second sum reads the new values.
    def f(x):
        a = torch.ops.aten.sum.default(x)
        torch.ops.aten.add_.Tensor(x, 1)
        return a * torch.ops.aten.sum.default(x)
    gm = torch.fx.symbolic_trace(f)
    assert merge_common_subexpressions(gm) == 0
    x = torch.ones(4)
    assert gm(x.clone()) == 4 * 8 and f(x.clone()) == 32


def test_values_of_unbacked_size_stay_apart():
    # Two .item() calls give two unbacked symbols; merged, the second's users would name a symbol
    # no node defines any more.
    def f(x):
        return torch.zeros(x.sum().item()), torch.ones(x.sum().item())
    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="symbolic")(torch.tensor([1, 2]))
    dense = torch.ops.aten._local_scalar_dense.default
    assert _count(gm, dense) == 2
    merge_common_subexpressions(gm)
    assert _count(gm, dense) == 2


def test_a_training_compile_does_not_import_inductor_to_merge():
    # AOTAutograd's own merging pass imports most of Inductor on first use (0.9 s of each process's
    # first training compile); smelt merges the joint graph itself and turns that pass off.
    import subprocess
    import sys
    code = (
        "import sys, torch, smelt\n"
        "w = torch.randn(8, 8, requires_grad=True)\n"
        "f = torch.compile(lambda x: ((x @ w).relu().sum() + (x @ w).relu().sum()), backend='smelt')\n"
        "x = torch.randn(4, 8)\n"
        "f(x).backward()\n"
        "g = w.grad.clone(); w.grad = None\n"
        "((x @ w).relu().sum() * 2).backward()\n"
        "torch.testing.assert_close(g, w.grad)\n"
        "print('pattern_matcher' in ' '.join(sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "SMELT_GRAPH_CACHE": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "False"


def test_random_draws_stay_apart_in_a_training_graph():
    # The joint graph AOTAutograd partitions is merged by smelt's pass too (backend.py).
    torch._dynamo.reset()
    f = torch.compile(lambda x: (F.dropout(x, 0.5, True) - F.dropout(x, 0.5, True)).abs().sum(), backend="smelt")
    x = torch.ones(1000, requires_grad=True)
    out = f(x)
    out.backward()
    assert out > 0 and x.grad.abs().sum() > 0  # two draws: neither their difference nor its gradient is zero
