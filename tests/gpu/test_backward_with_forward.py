"""A training graph's backward lowered with its forward, while worker processes build the forward's
kernels (backend.py, assemble's deferred builds): each graph's first call waits for its kernels, and
a backward compiled to write over its saved activations still runs twice over a kept graph
(retain_graph, create_graph), which AOTAutograd would refuse."""
import pytest
import torch
import torch.nn as nn

import smelt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("kept", ["retain_graph", "create_graph"])
def test_a_kept_graph_reads_the_saved_activations_twice(kept, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)).cuda()
    x = torch.randn(32, 16, device="cuda")
    params = list(model.parameters())
    expected = [g * 2 for g in torch.autograd.grad(model(x).sum(), params)]
    torch._dynamo.reset()
    with smelt.config.override(graph_cache=True, compile_workers=4, cache_dir=str(tmp_path)):
        loss = torch.compile(model, backend="smelt")(x).sum()
        graphs = {g.kind: g for g in smelt.observe.compiled_graphs()}
        assert "backward" in graphs  # lowered with its forward
        backward = graphs["backward"]  # copies of the saved activations it writes over, when kept
        assert backward.copied_when_kept == backward.namespace["WRITTEN_DONATED_INPUTS"]
        first = torch.autograd.grad(loss, params, **{kept: True})
        second = torch.autograd.grad(loss, params)
    for a, b, e in zip(first, second, expected):
        torch.testing.assert_close(a.detach() + b, e, atol=1e-4, rtol=1e-4)


def test_a_training_step_matches_eager_with_its_builds_deferred(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(),
                          nn.Linear(16 * 8 * 8, 10)).cuda()
    x = torch.randn(4, 3, 8, 8, device="cuda")
    expected = torch.autograd.grad(model(x).logsumexp(-1).sum(), list(model.parameters()))
    torch._dynamo.reset()
    with smelt.config.override(graph_cache=True, compile_workers=4, cache_dir=str(tmp_path)):
        compiled = torch.compile(model, backend="smelt")
        actual = torch.autograd.grad(compiled(x).logsumexp(-1).sum(), list(model.parameters()))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=2e-3, rtol=2e-3)
