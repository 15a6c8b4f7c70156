"""Data-dependent scalars (.item()), runtime size checks, and torch.cond."""

import pytest
import torch
import torch._dynamo

pytestmark = pytest.mark.smelt_only


@pytest.fixture
def capture_scalars():
    # Through the config's own patch: pytest 9's monkeypatch sees no plain attribute on a config
    # module and deletes the setting on undo, which breaks Dynamo for every later test.
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch._dynamo.reset()  # code compiled under other settings must not be reused
        yield


def _take_prefix(x, k):
    m = (k + 0).item()
    torch._check(m >= 0)
    torch._check(m <= x.shape[0])
    return x[:m] * 2 + m


def test_item_sizes_a_later_kernel(device, compile_fn, capture_scalars):
    x = torch.randn(10, device=device)
    fn = compile_fn(_take_prefix)
    for m in (3, 7, 0):
        k = torch.tensor(m, device=device)
        torch.testing.assert_close(fn(x, k), _take_prefix(x, k))


def test_runtime_check_on_an_item_raises(device, compile_fn, capture_scalars):
    x = torch.randn(10, device=device)
    fn = compile_fn(_take_prefix)
    fn(x, torch.tensor(4, device=device))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        fn(x, torch.tensor(11, device=device))


def test_item_used_as_a_value_in_a_fused_kernel(device, compile_fn, capture_scalars):
    def f(x, n):
        k = n.item()
        torch._check(k >= 1)
        return (x + 1) * k, torch.full((k,), 3.0, device=x.device)
    x, n = torch.randn(6, device=device), torch.tensor(5, device=device)
    actual, expected = compile_fn(f)(x, n), f(x, n)
    torch.testing.assert_close(actual, expected)


def _branchy(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a.sin() * b, a + 1), lambda a, b: (a.cos() - b, a * 2), (x, y))


def test_cond_takes_each_branch(device, compile_fn):
    fn = compile_fn(_branchy)
    y = torch.randn(4, 5, device=device)
    for x in (torch.rand(4, 5, device=device), -torch.rand(4, 5, device=device)):
        torch.testing.assert_close(fn(x, y), _branchy(x, y))


def test_cond_branches_are_smelt_kernels(device, compile_fn, observe):
    observe.reset()
    fn = compile_fn(_branchy)
    x, y = torch.rand(4, 5, device=device), torch.randn(4, 5, device=device)
    fn(x, y)
    kinds = [g.kind for g in observe.compiled_graphs()]
    assert "cond0_true_branch" in kinds and "cond0_false_branch" in kinds
    assert not any(g.fallback_ops for g in observe.compiled_graphs())
