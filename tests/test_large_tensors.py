"""Tensors of 2**31 elements and more: Triton kernels switch their index math to int64; Halide
buffers have int32 extents, so an op touching such a tensor runs as an ATen call there.

The decisions are tested on fake tensors (no memory); one real-size program runs under Halide."""
import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensorMode

BIG = 2 ** 31 + 64


def _traced(fn, *shapes_dtypes):
    """An ATen graph of `fn` traced on fake tensors: its nodes carry the traced values, no memory."""
    def returns_tuple(*args):  # as AOTAutograd's graphs do
        out = fn(*args)
        return out if isinstance(out, tuple) else (out,)
    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype) for shape, dtype in shapes_dtypes]
        return make_fx(returns_tuple, tracing_mode="fake")(*args)


def _generate(monkeypatch, backend, fn, *shapes_dtypes):
    import smelt.config
    from smelt.pipeline import generate_graph
    monkeypatch.setenv("SMELT_CPU_BACKEND", backend)
    return generate_graph(_traced(fn, *shapes_dtypes), "inference", smelt.config.Config())


PROGRAMS = {
    "pointwise": (lambda x: x + 1, [((BIG,), torch.int8)]),
    "reduction": (lambda x: (x * 2).amax(), [((BIG,), torch.int8)]),
    "rows": (lambda x: (x + 1).amax(1), [((2, 2 ** 30 + 32), torch.int8)]),
    "view_of_big_input": (lambda x: x[-8:] * 2, [((BIG,), torch.int8)]),
}


@pytest.mark.smelt_only
@pytest.mark.parametrize("program", PROGRAMS)
def test_halide_runs_ops_past_int32_extents_in_aten(monkeypatch, program):
    fn, inputs = PROGRAMS[program]
    generated = _generate(monkeypatch, "halide", fn, *inputs)
    assert not generated.kernels and generated.fallback_ops, (generated.kernels, generated.fallback_ops)


@pytest.mark.smelt_only
def test_halide_keeps_small_ops_of_a_graph_with_a_big_tensor(monkeypatch):
    generated = _generate(monkeypatch, "halide", lambda x, y: (x + 1, y.exp() * 2), ((BIG,), torch.bool),
                          ((64,), torch.float32))
    assert [k.backend for k in generated.kernels] == ["halide"] and generated.fallback_ops == ["aten.add.Tensor"]


@pytest.mark.smelt_only
@pytest.mark.parametrize("program", PROGRAMS)
def test_triton_index_math_is_int64_past_int32(monkeypatch, program):
    fn, inputs = PROGRAMS[program]
    generated = _generate(monkeypatch, "triton", fn, *inputs)
    assert generated.kernels and not generated.fallback_ops
    for kernel in generated.kernels:
        assert ".to(tl.int64)" in kernel.source, kernel.source
    small = _generate(monkeypatch, "triton", fn, *[((64,) if len(s) == 1 else (2, 32), d) for s, d in inputs])
    assert all(".to(tl.int64)" not in k.source for k in small.kernels)


@pytest.mark.smelt_only
@pytest.mark.skipif(os.environ.get("SMELT_CPU_BACKEND") != "halide" or os.environ.get("SMELT_TEST_DEVICE", "cpu") != "cpu",
                    reason="real size under Halide only (Triton's interpreter takes minutes over 2**31 elements)")
def test_real_tensor_past_int32_elements(compile_fn):
    # About 4 GB at the peak (x and x + 1); the expected values are known, so eager does not run it.
    x = torch.zeros(BIG, dtype=torch.int8)
    x[0], x[-3:] = 5, 9

    def f(x):
        y = x + 1
        return y.amax(), y[-4:] * 2, x.amin()
    top, tail, low = compile_fn(f)(x)
    assert top.item() == 10 and low.item() == 0
    assert tail.tolist() == [2, 20, 20, 20]
