"""Which linear-layer activations move into the matrix product's epilogue (the FX rewrite on fake
tensors, and on the CPU against eager; tests/gpu/test_gemm_epilogue.py runs CUDA against eager)."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from smelt.lowering.gemm_epilogue import fuse_gemm_epilogues

aten = torch.ops.aten


def _traced(fn, device="cuda", dtype=torch.bfloat16, bias_size=32):
    with FakeTensorMode():
        x = torch.empty(4, 8, 16, device=device, dtype=dtype)
        w = torch.empty(32, 16, device=device, dtype=dtype)
        b = torch.empty(bias_size, device=device, dtype=dtype)
        return make_fx(fn)(x, w, b)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act, use_gelu", [(lambda y: F.gelu(y, approximate="tanh"), True), (F.relu, False)])
def test_activation_after_a_linear_moves_into_the_product(act, use_gelu, dtype):
    gm = _traced(lambda x, w, b: act(F.linear(x, w, b)), dtype=dtype)
    assert fuse_gemm_epilogues(gm) == 1
    (product,) = [n for n in gm.graph.nodes if n.target is aten._addmm_activation.default]
    assert product.kwargs == {"use_gelu": use_gelu}
    assert aten.gelu.default not in _targets(gm) and aten.relu.default not in _targets(gm)
    assert aten.view.default in _targets(gm)  # the 3-D view now reshapes the activated product


@pytest.mark.parametrize("case", [
    "erf gelu",  # cuBLASLt's GELU is the tanh form
    "float32",  # no faster there
    "cpu",  # tanh GELU: the CPU's _addmm_activation computes the erf form
    "product read twice",  # the pre-activation value is needed as well
    "alpha",
])
def test_what_stays_a_separate_activation(case):
    fns = {
        "erf gelu": lambda x, w, b: F.gelu(F.linear(x, w, b)),
        "product read twice": lambda x, w, b: (lambda y: (F.relu(y), y * 2))(F.linear(x, w, b)),
        "alpha": lambda x, w, b: F.relu(torch.addmm(b, x.view(32, 16), w.t(), alpha=2.0)),
    }
    fn = fns.get(case, lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"))
    gm = _traced(fn, device="cpu" if case == "cpu" else "cuda",
                 dtype=torch.float32 if case == "float32" else torch.bfloat16)
    before = _targets(gm)
    assert fuse_gemm_epilogues(gm) == 0
    assert _targets(gm) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act, use_gelu", [(F.gelu, True), (F.relu, False)])
def test_cpu_product_applies_erf_gelu_and_relu(act, use_gelu, dtype):
    gm = _traced(lambda x, w, b: act(F.linear(x, w, b)), device="cpu", dtype=dtype)
    assert fuse_gemm_epilogues(gm) == 1
    (product,) = [n for n in gm.graph.nodes if n.target is aten._addmm_activation.default]
    assert product.kwargs == {"use_gelu": use_gelu}


def test_cpu_mlp_through_the_epilogue_matches_eager_bit_for_bit():
    import smelt  # noqa: F401
    torch._dynamo.reset()
    x, w1, b1 = torch.randn(64, 32), torch.randn(128, 32), torch.randn(128)
    w2, b2 = torch.randn(32, 128), torch.randn(32)

    def mlp(x):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

    torch.testing.assert_close(torch.compile(mlp, backend="smelt")(x), mlp(x), rtol=0, atol=0)
