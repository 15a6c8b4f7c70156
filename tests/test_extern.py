"""Ops that go to ATen extern calls (mm/bmm/addmm/linear/conv2d) mixed with pointwise ops."""

import pytest
import torch
import torch.nn.functional as F

TOL = dict(atol=1e-4, rtol=1e-4)


def test_mm_with_pointwise_prologue_and_epilogue(device, check):
    a = torch.randn(17, 33, device=device)
    b = torch.randn(33, 9, device=device)
    check(lambda a, b: torch.relu(torch.mm(a * 0.5, b.exp()) + 1), a, b, **TOL)


def test_matmul_operator_on_transposed_input(device, check):
    a = torch.randn(33, 17, device=device)
    b = torch.randn(33, 9, device=device)
    check(lambda a, b: (a.t() @ b).tanh(), a, b, **TOL)


def test_bmm_with_softmax(device, check):
    q = torch.randn(3, 17, 8, device=device)
    k = torch.randn(3, 33, 8, device=device)
    v = torch.randn(3, 33, 8, device=device)
    check(lambda q, k, v: torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.35, dim=-1), v), q, k, v, **TOL)


def test_addmm_with_bias_and_activation(device, check):
    bias = torch.randn(9, device=device)
    a = torch.randn(17, 33, device=device)
    b = torch.randn(33, 9, device=device)
    check(lambda bias, a, b: F.gelu(torch.addmm(bias, a, b, beta=0.5, alpha=2.0)), bias, a, b, **TOL)


def test_linear_with_and_without_bias(device, check):
    x = torch.randn(17, 33, device=device)
    w = torch.randn(9, 33, device=device)
    b = torch.randn(9, device=device)
    check(lambda x, w, b: (F.linear(x, w, b).sigmoid(), F.linear(x.cos(), w)), x, w, b, **TOL)


def test_linear_on_3d_input(device, check):
    x = torch.randn(3, 7, 33, device=device)
    w = torch.randn(9, 33, device=device)
    b = torch.randn(9, device=device)
    check(lambda x, w, b: F.silu(F.linear(x, w, b)).sum(dim=1), x, w, b, **TOL)


def test_conv2d_with_bias_and_relu(device, check):
    x = torch.randn(2, 3, 9, 9, device=device)
    w = torch.randn(4, 3, 3, 3, device=device)
    b = torch.randn(4, device=device)
    check(lambda x, w, b: torch.relu(F.conv2d(x, w, b, padding=1)) * 2, x, w, b, **TOL)


def test_conv2d_stride_no_bias_then_mean(device, check):
    x = torch.randn(2, 3, 11, 11, device=device)
    w = torch.randn(5, 3, 3, 3, device=device)
    check(lambda x, w: F.conv2d(x + 1, w, stride=2).mean(dim=(2, 3)), x, w, **TOL)


def test_two_matmuls_chained_with_pointwise(device, check):
    x = torch.randn(17, 33, device=device)
    w1 = torch.randn(33, 20, device=device)
    w2 = torch.randn(20, 7, device=device)
    check(lambda x, w1, w2: torch.mm(torch.mm(x, w1).relu() - 0.1, w2) * 0.5, x, w1, w2, **TOL)


def test_linalg_error_check_runs_and_raises_like_eager(device, check, compile_fn):
    # linalg.inv checks its LAPACK status through an effectful op (with_effects): it must run
    # even though nothing reads its result, and raise on a singular matrix as eager does.
    a = torch.randn(4, 4, device=device, dtype=torch.float64) + 4 * torch.eye(4, device=device, dtype=torch.float64)
    check(lambda m: torch.linalg.inv(m) * 2, a)
    fn = compile_fn(lambda m: torch.linalg.inv(m) * 2)
    singular = torch.zeros(4, 4, device=device, dtype=torch.float64)
    try:
        torch.linalg.inv(singular)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="singular"):
            fn(singular)
    else:
        fn(singular)  # eager does not check on this device; neither need smelt


def test_an_op_returning_nothing_is_kept_for_its_effect(device, compile_fn):
    # Nothing reads the result of a check; it must run anyway.
    def f(m, info):
        torch.ops.aten._linalg_check_errors(info, "linalg.inv", is_matrix=True)
        return m * 2
    fn = compile_fn(f)
    torch.testing.assert_close(fn(torch.ones(3, device=device), torch.tensor(0, dtype=torch.int32, device=device)),
                               torch.full((3,), 2.0, device=device))
    with pytest.raises(RuntimeError, match="singular"):
        fn(torch.ones(3, device=device), torch.tensor(1, dtype=torch.int32, device=device))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_device_copy_between_cpu_and_cuda_is_not_a_fallback(check, observe):
    observe.reset()
    check(lambda x: ((x * 2).to("cuda") + 1).cpu().sum(), torch.randn(8, 16))
    assert not any(g.fallback_ops for g in observe.compiled_graphs())


def test_extern_calls_use_the_public_binding_only_where_it_is_the_same_overload():
    """The wrapper calls `torch.<name>` (argument parsing in C++, cheaper per call) only where no
    other overload could be picked by the default's arguments, and torch.<name> is the binding."""
    from smelt.codegen.wrapper import op_source
    aten = torch.ops.aten
    assert op_source(aten.convolution.default) == "torch.convolution"
    assert op_source(aten.mm.default) == "torch.mm"  # mm.dtype needs an out_dtype
    assert op_source(aten.add.Tensor) == "torch.ops.aten.add.Tensor"  # not a default overload
    assert op_source(aten.sum.default) == "torch.ops.aten.sum.default"  # sum.dim_IntList takes its arguments
    assert op_source(aten.randn.default) == "torch.ops.aten.randn.default"  # randn.generator
    assert op_source(aten.unique_dim.default) == "torch.ops.aten.unique_dim.default"  # no binding
    assert op_source(aten.native_layer_norm.default).startswith("torch.")
    # torch.norm is a Python function, not the binding of aten.norm
    assert op_source(aten.norm.ScalarOpt_dim) == "torch.ops.aten.norm.ScalarOpt_dim"


def test_a_convolution_called_through_its_binding_matches_eager(device, check, observe):
    w = torch.randn(5, 3, 3, 3, device=device)
    x = torch.randn(2, 3, 8, 8, device=device)
    check(lambda x: torch.relu(F.conv2d(x, w, stride=2, padding=1)), x, **TOL)
    (graph,) = observe.compiled_graphs()
    assert "torch.convolution(" in graph.wrapper_source
