"""A dead buffer's memory taken by a later buffer of its size (scheduler/pool.py)."""
import re

import pytest
import torch

import smelt
from conftest import DEVICE, allocated_shapes

pytestmark = pytest.mark.smelt_only


def _compiled(fn, *args, observe, **settings):
    torch._dynamo.reset()
    observe.reset()
    settings.setdefault("cpu_workspace", False)  # on the CPU it would place these buffers instead
    with torch.no_grad(), smelt.config.override(**settings):
        out = torch.compile(fn, backend="smelt")(*args)
    return out, observe.compiled_graphs()[-1]


def _randn(*size):
    return torch.randn(*size, device=DEVICE)


def _taken(source: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(\w+) = (?:reinterpret_tensor\()?(\w+).*# dead \w+'s memory$", source, flags=re.M))


def _chain(x, w):
    # Each softmax is a [32, 32] buffer that dies in the next product: the later ones can take the
    # earlier ones' memory (not the product's in place: a softmax over its columns reads other
    # elements than it writes).
    for _ in range(4):
        x = (x @ w).t().softmax(-1)
    return x


def test_a_later_buffer_takes_a_dead_ones_memory(observe):
    x, w = _randn(32, 32), _randn(32, 32) * 0.1
    out, graph = _compiled(_chain, x, w, observe=observe)
    torch.testing.assert_close(out, _chain(x, w))
    taken = _taken(graph.wrapper_source)
    assert taken, graph.wrapper_source
    _, without = _compiled(_chain, x, w, observe=observe, buffer_pool=False)
    assert not _taken(without.wrapper_source)
    assert len(allocated_shapes(graph.wrapper_source)) == len(allocated_shapes(without.wrapper_source)) - len(taken)
    assert graph.planned_peak_bytes <= without.planned_peak_bytes


def test_another_shape_of_the_same_size_takes_the_memory_through_a_view(observe):
    def f(x, w):
        a = (x @ w).t().softmax(-1)  # [64, 32], dead in the next product
        b = (a @ x).t().softmax(-1)  # [32, 64]: the same 2048 elements
        return b @ torch.ones(64, 2, device=x.device)
    x, w = _randn(32, 32), _randn(32, 64) * 0.1
    out, graph = _compiled(f, x, w, observe=observe)
    torch.testing.assert_close(out, f(x, w), atol=1e-4, rtol=1e-4)
    assert re.search(r"= reinterpret_tensor\(\w+, \(32, 64\), \(64, 1\)\); del \w+  # dead", graph.wrapper_source), \
        graph.wrapper_source


def test_a_buffer_an_aten_view_reads_is_never_taken(observe, monkeypatch):
    """A view an ATen call returns keeps its base's memory alive after the base's name dies."""
    from smelt.lowering import registry
    monkeypatch.delitem(registry.LOWERINGS, torch.ops.aten.diagonal.default)  # runs through ATen: a view

    def f(x, w):
        a = (x @ w).t().softmax(-1)  # (over the product's columns: not written over it)
        d = torch.ops.aten.diagonal.default(a)  # a view of a, read at the end
        b = (a @ w).t().softmax(-1)  # a's last kernel reader; b would take a's memory once a dies
        c = (b @ w).t().softmax(-1)  # could take b's
        return c @ w, d * 2
    x, w = _randn(16, 16), _randn(16, 16) * 0.1
    out, graph = _compiled(f, x, w, observe=observe)
    for got, expected in zip(out, f(x, w)):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    viewed = re.findall(r"torch\.[\w.]*diagonal[\w.]*\((\w+)", graph.wrapper_source)
    taken = _taken(graph.wrapper_source)
    assert viewed and taken, graph.wrapper_source  # the pool works here, but not on the viewed buffer
    assert not set(viewed) & set(taken.values()), graph.wrapper_source


def test_an_aten_results_memory_is_never_taken(observe):
    """An ATen result's storage may be larger than its layout (or shared with another result):
    only buffers the wrapper allocated are handed on."""
    x, w = _randn(32, 32), _randn(32, 32) * 0.1
    _, graph = _compiled(_chain, x, w, observe=observe)
    products = set(re.findall(r"^\s*(\w+) = torch\.mm\(", graph.wrapper_source, flags=re.M))
    assert products and not products & set(_taken(graph.wrapper_source).values()), graph.wrapper_source


def test_holding_a_dead_buffer_never_raises_the_planned_peak(observe):
    def f(x, w, big):
        a = (x @ w).softmax(-1)  # [64, 64]; dies in the next product
        y = a @ w
        z = (big * 2) @ w.repeat(64, 1)  # an ATen result as large as everything else, alive for a moment
        b = (y + z).softmax(-1)  # [64, 64]: could take a's memory, held across the large one's life
        return b @ w
    x, w, big = _randn(64, 64), _randn(64, 64) * 0.1, _randn(64, 4096)
    out, graph = _compiled(f, x, w, big, observe=observe)
    torch.testing.assert_close(out, f(x, w, big), atol=1e-4, rtol=1e-4)
    _, without = _compiled(f, x, w, big, observe=observe, buffer_pool=False)
    assert graph.planned_peak_bytes <= without.planned_peak_bytes


def test_a_training_step_with_the_pool_matches_eager():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(24, 24) for _ in range(6)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.LayerNorm(24), torch.nn.GELU())])
    x = _randn(8, 24)
    model.to(DEVICE)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    torch.compile(model, backend="smelt")(x).square().mean().backward()
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, e, atol=1e-5, rtol=1e-4)
