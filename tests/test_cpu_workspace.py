"""CPU buffers that live only inside a call, placed in one block per thread kept between calls
(scheduler/workspace.py, runtime/cpu_workspace.py)."""
import re

import pytest
import torch
from conftest import failures_in_threads
import torch.nn.functional as F

import smelt
from smelt.scheduler.workspace import _pack

pytestmark = pytest.mark.smelt_only


def _compiled(fn, observe, **settings):
    torch._dynamo.reset()
    observe.reset()
    with smelt.config.override(**settings):
        compiled = torch.compile(fn, backend="smelt")

    def call(*args):
        with torch.no_grad(), smelt.config.override(**settings):
            return compiled(*args)
    return call


def _block(x, w1, w2):
    # Intermediates a kernel writes and an ATen product reads: call-local buffers.
    h = F.gelu(F.layer_norm(x, x.shape[-1:]) @ w1)
    return torch.tanh(h @ w2) + x, (h * 2).sum(0)


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 32, generator=g), torch.randn(32, 48, generator=g), torch.randn(48, 32, generator=g)


def _wrapper(observe) -> str:
    return "\n".join(g.wrapper_source for g in observe.compiled_graphs())


def test_call_local_buffers_live_in_the_workspace_and_outputs_do_not(observe):
    """The buffers are the workspace's; what the call returns is memory of its own: a later call
    (other inputs, the same workspace) leaves the first call's results as they were."""
    call = _compiled(_block, observe)
    first_inputs, second_inputs = _inputs(0), _inputs(1)
    first = call(*first_inputs)
    kept = [t.clone() for t in first]
    source = _wrapper(observe)
    assert re.search(r"^\s*buf\d+ = workspace\[0\]$", source, flags=re.M), source
    second = call(*second_inputs)
    for got, expected in zip(first, kept):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got, expected in zip(second, _block(*second_inputs)):
        torch.testing.assert_close(got, expected)
    workspace = next(g for g in observe.compiled_graphs()).call.__globals__["cpu_workspace"]
    start = workspace.buffers()[0].untyped_storage().data_ptr()
    for out in (*first, *second):
        assert not start <= out.data_ptr() < start + workspace.size


def _products(x, w1, w2, b, q):
    h = x @ w1  # read by the kernel below, which may write over it, and dead after it
    y = torch.addmm(b, F.silu(h) * 2, w2)  # returned
    p = torch.softmax(torch.bmm(q, q.transpose(1, 2)), -1)
    return y, torch.baddbmm(q, p, q).sum(0), y @ w2.t()


def test_products_write_into_their_places_and_returned_ones_do_not(observe):
    """ATen's products take a workspace place through `out=` where their result dies in the call
    (a fresh result faulted its pages in at every call); returned ones stay memory of their own."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=g) for s in ((64, 32), (32, 48), (48, 32), (32,), (4, 16, 8))]
    call = _compiled(_products, observe)
    first = call(*inputs)
    kept = [t.clone() for t in first]
    source = _wrapper(observe)
    for product in ("mm", "bmm"):
        assert re.search(rf"^\s*torch\.{product}\(.*, out=buf\d+\)$", source, flags=re.M), source
    second_inputs = [t * 1.5 for t in inputs]
    second = call(*second_inputs)
    for got, expected in zip(first, kept):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got, expected in zip(second, _products(*second_inputs)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    workspace = next(g for g in observe.compiled_graphs()).call.__globals__["cpu_workspace"]
    start = workspace.buffers()[0].untyped_storage().data_ptr()
    for out in (*first, *second):
        assert not start <= out.data_ptr() < start + workspace.size


def test_a_returned_view_of_an_intermediate_is_not_placed(observe):
    """An output viewing a buffer (a transpose, a slice) keeps that buffer alive past the call."""
    def fn(x, w):
        h = torch.relu(x @ w) * 3
        return h.t(), h[:, :5], (h @ w.t()).sum()

    x, w = torch.randn(16, 8), torch.randn(8, 8)
    call = _compiled(fn, observe)
    first = call(x, w)
    kept = [t.clone() for t in first]
    call(x * 2, w * 3)
    for got, expected in zip(first, kept):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got, expected in zip(call(x, w), fn(x, w)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("launch", ["c", "ctypes"])
def test_threads_calling_at_once_each_get_a_block(observe, monkeypatch, launch):
    """Four threads calling one compiled graph at once: each its own workspace block, and each
    Halide launch its own buffer descriptions (they were the launcher's: with the GIL released for
    the pipeline, another thread's launch overwrote them, and results came out wrong)."""
    if launch == "ctypes":
        from smelt.runtime import halide_launcher
        monkeypatch.setattr(halide_launcher.HalideLauncher, "_runner", lambda self, cache_dir: None)
    call = _compiled(_block, observe)
    call(*_inputs(0))  # compiled once, before the threads

    def worker(seed):
        inputs = _inputs(seed)
        expected = _block(*inputs)
        for _ in range(20):
            for got, want in zip(call(*inputs), expected):
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), "wrong values"
    failures = failures_in_threads(worker, 4)
    assert not failures, failures


def test_a_training_step_with_the_workspace_matches_eager(observe):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                torch.nn.Linear(64, 32))
    x = torch.randn(16, 32)
    expected_loss = model(x).square().mean()
    expected_loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    observe.reset()
    step = torch.compile(lambda x: model(x).square().mean(), backend="smelt")
    for _ in range(2):  # the second step reuses the blocks the first left
        model.zero_grad()
        loss = step(x)
        loss.backward()
        torch.testing.assert_close(loss, expected_loss)
        for p, g in zip(model.parameters(), expected):
            torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def test_switched_off_every_buffer_is_allocated(observe):
    call = _compiled(_block, observe, cpu_workspace=False)
    call(*_inputs(0))
    assert "workspace" not in _wrapper(observe)


def test_packing_shares_offsets_across_lifetimes_only():
    sizes = {"a": 1000, "b": 1000, "c": 500, "d": 64}
    lifetimes = {"a": (0, 2), "b": (3, 5), "c": (1, 4), "d": (5, 6)}
    plan = _pack(sizes, lifetimes)

    def overlaps(x, y):
        (f1, l1), (f2, l2) = lifetimes[x], lifetimes[y]
        s1, s2 = plan.offsets[x], plan.offsets[y]
        return f1 <= l2 and f2 <= l1 and s1 < s2 + sizes[y] and s2 < s1 + sizes[x]
    names = list(sizes)
    assert not any(overlaps(x, y) for i, x in enumerate(names) for y in names[i + 1:])
    assert plan.offsets["a"] == plan.offsets["b"]  # never alive together
    assert plan.size < sum(sizes.values())
    assert all(offset % 64 == 0 for offset in plan.offsets.values())
