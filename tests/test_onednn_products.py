"""Float32 CPU products over a Linear's weight through oneDNN's linear where timing chose it
(runtime/onednn_linear.py, SMELT_ONEDNN_PRODUCTS)."""
import glob
import os

import pytest
import torch

import smelt
from smelt.runtime import onednn_linear

pytestmark = [pytest.mark.smelt_only,
              pytest.mark.skipif(not onednn_linear.available(), reason="this torch has no oneDNN linear")]


def _wrapper(observe):
    return "\n".join(g.wrapper_source for g in observe.compiled_graphs())


def _compiled(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(fn, backend="smelt")(*args)


@pytest.mark.parametrize("bias", [True, False])
def test_a_linear_through_onednn_matches_eager(bias, observe):
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 40, bias=bias)
    x = torch.randn(3, 7, 96)  # a Linear over 3-D input: its product is over the rows flattened
    with smelt.config.override(onednn_products="on"):
        actual = _compiled(lambda t: torch.relu(layer(t)) * 2, x)
    with torch.no_grad():
        torch.testing.assert_close(actual, torch.relu(layer(x)) * 2, atol=1e-5, rtol=1e-5)
    assert "smelt.onednn_linear" in _wrapper(observe)


def test_off_and_other_layouts_keep_atens_product(observe):
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 16)
    weight = torch.randn(32, 16)  # already [K, N]: its transpose is not a Linear's weight
    x = torch.randn(8, 32)
    with smelt.config.override(onednn_products="off"):
        torch.testing.assert_close(_compiled(layer, x), layer(x).detach())
    assert "onednn_linear" not in _wrapper(observe)
    observe.reset()
    with smelt.config.override(onednn_products="on"):
        torch.testing.assert_close(_compiled(lambda t: t @ weight, x), x @ weight)
        torch.testing.assert_close(_compiled(lambda t: t.t() @ t, x), x.t() @ x)
    assert "onednn_linear" not in _wrapper(observe)


def _cpu_target_times_products() -> bool:
    from smelt.codegen import backends
    return backends.for_device(smelt.config.current(), torch.device("cpu")).target("cpu").onednn_products


@pytest.mark.parametrize("faster", ["onednn", "aten"])
def test_auto_takes_the_library_timed_faster_and_keeps_the_choice(faster, tmp_path, monkeypatch, observe):
    if not _cpu_target_times_products():  # Triton's interpreter on the CPU plans as for the GPU
        pytest.skip("this backend's CPU target leaves products to ATen")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(onednn_linear, "_chosen", {})
    timed = []

    def fake_time(*shape):
        timed.append(shape)
        return (1.0, 0.5) if faster == "onednn" else (0.5, 1.0)
    monkeypatch.setattr(onednn_linear, "_time", fake_time)
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    torch.testing.assert_close(_compiled(layer, x), layer(x).detach(), atol=1e-4, rtol=1e-4)
    assert timed == [(64, 256, 256, True)]
    assert ("smelt.onednn_linear" in _wrapper(observe)) == (faster == "onednn")
    assert len(glob.glob(os.path.join(tmp_path, "autotune", "*.json"))) == 1

    monkeypatch.setattr(onednn_linear, "_chosen", {})  # as a new process: read from the cache folder
    observe.reset()
    torch.testing.assert_close(_compiled(layer, x * 2), layer(x * 2).detach(), atol=1e-4, rtol=1e-4)
    assert timed == [(64, 256, 256, True)]
    assert ("smelt.onednn_linear" in _wrapper(observe)) == (faster == "onednn")

    observe.reset()  # a product of fewer multiply-adds than MIN_MACS stays in ATen untimed
    small = torch.nn.Linear(24, 12)
    torch.testing.assert_close(_compiled(small, x[:5, :24]), small(x[:5, :24]).detach())
    assert timed == [(64, 256, 256, True)] and "onednn_linear" not in _wrapper(observe)


def test_the_timing_runs_real_products_under_the_compilers_fake_mode():
    """Lowering runs under AOTAutograd's fake mode, where a product costs nothing: timed there, ATen's
    addmm read 0.195 ms against oneDNN's 0.327 on a shape where it takes 0.87 against 0.43."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        aten_ms, onednn_ms = onednn_linear._time(64, 512, 512, True)
    assert aten_ms > 0.005 and onednn_ms > 0.005  # 33 MFLOP each: real work


@pytest.mark.parametrize("activation", [torch.relu, torch.nn.functional.gelu])
def test_a_linears_activation_runs_as_onednns_post_op(activation, observe):
    """A Linear then ReLU or GELU is one _addmm_activation on the CPU (lowering/gemm_epilogue.py):
    through oneDNN the activation is its post-op, GELU in erf's form as eager's."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(2, 9, 64) * 3
    with smelt.config.override(onednn_products="on"):
        actual = _compiled(lambda t: activation(layer(t)), x)
    with torch.no_grad():
        torch.testing.assert_close(actual, activation(layer(x)), atol=1e-5, rtol=1e-5)
    assert "smelt.onednn_linear" in _wrapper(observe) and "_addmm_activation" not in _wrapper(observe)


@pytest.mark.parametrize("shape", [(5, 0, 10), (0, 4, 3), (3, 4, 0)])
def test_an_empty_product_stays_in_aten(shape, observe):
    """oneDNN makes no primitive for an inner size of 0 (the OpInfo samples of mm, multi_dot, pinv)."""
    rows, inner, columns = shape
    x, w, b = torch.randn(rows, inner), torch.randn(columns, inner), torch.randn(columns)
    with smelt.config.override(onednn_products="on"):
        torch.testing.assert_close(_compiled(lambda a, c: a @ c.t(), x, w), x @ w.t())
        torch.testing.assert_close(_compiled(lambda a, c, d: torch.addmm(d, a, c.t()), x, w, b), torch.addmm(b, x, w.t()))
    assert "onednn_linear" not in _wrapper(observe)
