"""Compile time by stage (smelt/compile_stages.py): every compiled graph says where its compile went."""
import pytest
import torch

from smelt import compile_stages

pytestmark = pytest.mark.smelt_only

GENERATION = {"plan", "lower", "schedule", "codegen"}


def test_each_graph_records_its_stages(device, compile_fn, observe):
    compile_stages.totals.clear()
    x = torch.randn(8, 32, device=device)
    compile_fn(lambda x: torch.softmax(x * 2, -1).sum(0))(x)
    (graph,) = observe.compiled_graphs()
    seconds = graph.stage_seconds
    assert set(seconds) >= GENERATION | {"load", "cache"}, seconds
    assert all(v >= 0 for v in seconds.values()), seconds
    assert seconds["lower"] > 0 and seconds["codegen"] > 0
    for stage, spent in seconds.items():
        assert compile_stages.totals[stage] >= spent - 1e-9


def test_a_cache_hit_records_no_generation(tmp_path, monkeypatch, device, compile_fn, observe):
    if device == "cpu" and __import__("os").environ.get("SMELT_CPU_BACKEND") == "reference":
        pytest.skip("reference kernels are never cached")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "1")
    monkeypatch.delenv("SMELT_DEBUG_DIR", raising=False)
    x = torch.randn(8, 32, device=device)
    for _ in range(2):
        torch._dynamo.reset()
        compile_fn(lambda x: torch.softmax(x * 3, -1))(x)
    seconds = observe.compiled_graphs()[-1].stage_seconds  # empty for a Dynamo-level hit
    assert not GENERATION & set(seconds), seconds
