"""Clones that copy a fresh value no one else reads are dropped before lowering
(lowering/fx_clones.py); clones whose copy someone could tell apart stay."""
import pytest
import torch
import torch.nn as nn

from smelt.lowering.fx_clones import drop_redundant_clones

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]
aten = torch.ops.aten


def _aten_graph(fn, *args):
    return torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)


def _clones(gm) -> int:
    return sum(n.target is aten.clone.default for n in gm.graph.nodes)


def test_dropout_in_eval_copies_nothing():
    """Dropout's eval decomposition is a clone: an MLP's activation went through a copy, and both
    were alive at once (ConvNeXt's peak)."""
    mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        gm = _aten_graph(lambda x: mlp(x), x)
        gm.graph.eliminate_dead_code()
        before = _clones(gm)
        drop_redundant_clones(gm)
        torch.testing.assert_close(gm(x), mlp(x))
    if before:  # the decomposition of the day may or may not clone: then nothing is left
        assert _clones(gm) == 0


def test_a_clone_of_a_fresh_single_use_value_goes():
    gm = _aten_graph(lambda x: torch.exp(x).clone() * 2, torch.randn(5))
    assert drop_redundant_clones(gm) == 1
    x = torch.randn(5)
    torch.testing.assert_close(gm(x), torch.exp(x) * 2)


def test_a_clone_of_a_reshaped_fresh_value_goes():
    gm = _aten_graph(lambda x: torch.exp(x).view(4, 5, 6).clone() * 2, torch.randn(20, 6))
    assert drop_redundant_clones(gm) == 1
    x = torch.randn(20, 6)
    torch.testing.assert_close(gm(x), torch.exp(x).view(4, 5, 6) * 2)


def _read_twice(x):
    y = torch.exp(x)
    return y, y.clone()


def _view_of_a_value_read_twice(x):
    y = torch.exp(x)
    return y + 1, y.view(6, 20).clone()


KEPT = {
    "graph input": lambda x: x.clone(),  # the caller's tensor and its copy
    "read twice": _read_twice,
    "a slice with gaps": lambda x: torch.exp(x)[:, :, ::2].clone(),
    "another memory format": lambda x: torch.exp(x).clone(memory_format=torch.channels_last),
    "a view of a value read twice": _view_of_a_value_read_twice,
    "a view of an input": lambda x: x.view(6, 20).clone(),
    # Found by a review: as_strided after the clone addresses storage from its start.
    "a view at an offset": lambda x: torch.exp(x)[1:].clone(),
    # Returned views of intermediates: see test_a_returned_clone_of_a_view_stays_fresh_memory.
    "a returned view of an intermediate": lambda x: torch.exp(x).transpose(0, 1).clone(),
}


@pytest.mark.parametrize("case", list(KEPT))
def test_clones_someone_could_tell_apart_stay(case):
    x = torch.randn(2, 3, 4, 5)
    fn = KEPT[case]
    gm = _aten_graph(fn, x)
    assert drop_redundant_clones(gm) == 0


def test_compiled_results_share_no_memory_with_inputs_or_each_other(compile_fn, device):
    def fn(x):
        y = torch.exp(x)
        return x.clone(), y, y.clone(), torch.sin(x).clone()
    x = torch.randn(6, 7, device=device)
    outs = compile_fn(fn)(x)
    for a, e in zip(outs, fn(x)):
        torch.testing.assert_close(a, e)
    pointers = [x.data_ptr()] + [o.data_ptr() for o in outs]
    assert len(set(pointers)) == len(pointers)


def test_convnext_mlp_has_no_copy_kernel(compile_fn, device, observe):
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.0), nn.Linear(64, 16)).to(device).eval()
    x = torch.randn(2, 5, 5, 16, device=device)
    with torch.no_grad():
        actual = compile_fn(mlp)(x)
        torch.testing.assert_close(actual, mlp(x), atol=1e-5, rtol=1e-5)
    kernels = [k for g in observe.compiled_graphs() for k in g.kernel_names]
    assert not any("clone" in k for k in kernels), kernels


def test_an_as_strided_after_a_clone_of_an_offset_view_reads_the_clone(compile_fn, device):
    # The clone of (x * 2)[1:] was dropped: as_strided's offset 0 then read the product's start.
    fn = lambda x: (x * 2)[1:].clone().as_strided((2, 2), (1, 2), 0) * 1  # noqa: E731
    for grad in (False, True):
        torch._dynamo.reset()
        x = torch.arange(12., device=device).view(3, 4).requires_grad_(grad)
        torch.testing.assert_close(compile_fn(fn)(x), fn(x))


def test_a_returned_clone_of_a_view_stays_fresh_memory(compile_fn, device):
    # Dropped, the forward returned a transposed product both to the caller and as a saved tensor
    # (two tensor objects): zeroing the output in place silently changed the weight's gradient.
    # Kept, the write is caught as AOTAutograd catches it; and an ATen view (view_as_real) returned
    # from the compiled function took no in-place write at all.
    def fn(x, w):
        c = torch.nn.functional.dropout((x @ w).t(), 0.0, training=True)
        return c, torch.tanh(c) * 3
    x, w = torch.randn(3, 4, device=device), torch.randn(4, 5, device=device, requires_grad=True)
    c, d = compile_fn(fn)(x, w)
    c.mul_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        d.sum().backward()
    torch._dynamo.reset()
    real = lambda x: torch.view_as_real((x * 2).to(torch.complex64)).clone()  # noqa: E731
    z = torch.randn(3, 4, device=device, requires_grad=True)
    out = compile_fn(real)(z)
    out.mul_(3)
    torch.testing.assert_close(out, real(z) * 3)
