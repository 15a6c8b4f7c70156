"""Bad cases give errors and log lines that name what is at fault (smelt only)."""
import logging

import pytest
import torch
from conftest import inspects_triton_kernels

pytestmark = pytest.mark.smelt_only


def test_kernel_that_fails_to_compile_names_kernel_source_and_ops(device, compile_fn, monkeypatch):
    import smelt
    from smelt.codegen.triton import ops as triton_ops

    inspects_triton_kernels()
    # Break one op's Triton form so that the generated kernel cannot compile.
    monkeypatch.setitem(triton_ops.FLOAT_UNARY, "exp", "tl.no_such_function({0})")
    x = torch.randn(17, 33, device=device)
    with pytest.raises(Exception) as info:
        compile_fn(lambda x: torch.exp(x) + 1)(x)
    error = info.value
    while error is not None and not isinstance(error, smelt.errors.KernelCompileError):
        error = error.__cause__ or error.__context__
    assert error is not None, f"no KernelCompileError in the chain of {info.value!r}"
    message = str(error)
    assert "triton_poi_fused_add_exp_0" in message
    assert "aten.exp.default" in message and "aten.add.Tensor" in message
    path = message.split("source: ")[1].split(";")[0]
    with open(path) as f:
        assert "tl.no_such_function" in f.read()


def test_fallback_is_correct_and_logged_with_the_op_name(device, compile_fn, caplog):
    x = torch.randn(5, 5, device=device) + 5 * torch.eye(5, device=device)
    with caplog.at_level(logging.DEBUG, logger="smelt.lowering"):
        actual = compile_fn(lambda x: torch.linalg.det(x) * 2)(x)
    torch.testing.assert_close(actual, torch.linalg.det(x) * 2, rtol=1e-4, atol=1e-4)
    assert any("no lowering for aten." in r.getMessage() and "runs through its ATen kernel" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_lowering_error_names_the_op_and_its_inputs(device, compile_fn, monkeypatch):
    import smelt
    from smelt.lowering import registry

    def broken(g, *args, **kwargs):
        raise ValueError("deliberately broken lowering")

    monkeypatch.setitem(registry.LOWERINGS, torch.ops.aten.tanh.default, broken)
    x = torch.randn(3, 4, device=device)
    with pytest.raises(Exception) as info:
        compile_fn(lambda x: torch.tanh(x))(x)
    message = str(info.value)
    assert "aten.tanh.default" in message and "[3, 4]" in message and "deliberately broken" in message
    assert "LoweringError" in message or isinstance(info.value, smelt.errors.LoweringError)
