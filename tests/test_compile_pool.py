"""CPU kernels compiled in worker processes before a graph loads them (runtime/compile_pool.py)."""
import logging

import pytest
import torch

import smelt
from smelt.runtime import compile_pool, halide_compile

pytestmark = [pytest.mark.smelt_only,
              pytest.mark.skipif(smelt.config.current().cpu_backend != "halide", reason="Halide's CPU kernels")]


def _kernels(observe):
    graph = observe.compiled_graphs()[-1]
    return [(name, graph.kernel_sources[name], graph.kernel_paths[name]) for name in graph.kernel_names]


def test_workers_build_a_graphs_kernels_into_the_cache(tmp_path, observe):
    torch._dynamo.reset()
    observe.reset()
    with smelt.config.override(compile_workers=1):  # compiled here first, to learn the kernels
        torch.compile(lambda x: (x.sin().sum(0), x.cos().amax(1), x.exp() + 1), backend="smelt")(torch.randn(40, 30))
    kernels = _kernels(observe)
    assert len(kernels) >= 2
    cache = str(tmp_path / "cache")
    assert not any(halide_compile.is_built(n, s, cache) for n, s, _ in kernels)
    assert compile_pool.compile_ahead(kernels, cache, workers=2) == len(kernels)
    assert all(halide_compile.is_built(n, s, cache) for n, s, _ in kernels)
    assert compile_pool.compile_ahead(kernels, cache, workers=2) == 0  # nothing left to build


def test_a_graph_compiled_with_workers_matches_eager(tmp_path):
    torch._dynamo.reset()
    x = torch.randn(33, 17)

    def f(x):
        return torch.softmax(x, -1) * x.tanh().mean(0), (x * 3).cumsum(1)

    with smelt.config.override(compile_workers=2, cache_dir=str(tmp_path)):
        actual = torch.compile(f, backend="smelt")(x)
    for a, e in zip(actual, f(x)):
        torch.testing.assert_close(a, e)


def test_a_kernel_that_fails_in_a_worker_is_left_to_the_main_process(tmp_path, caplog, observe):
    torch._dynamo.reset()
    observe.reset()
    with smelt.config.override(compile_workers=1):
        torch.compile(lambda x: x.sin() + x.cos().sum(), backend="smelt")(torch.randn(20))
    good = _kernels(observe)
    broken = ("halide_poi_broken_0", "raise ValueError('not a kernel')\n", None)
    with caplog.at_level(logging.DEBUG, logger="smelt.runtime"):
        assert compile_pool.compile_ahead([*good, broken], str(tmp_path), workers=2) == len(good)
    assert "halide_poi_broken_0 did not compile in a worker (ValueError: not a kernel)" in caplog.text


def test_a_worker_starts_without_torch(tmp_path):
    worker = compile_pool._Worker()
    try:
        reply = worker.compile({"name": "k", "source": "raise ValueError('x')\n", "cache_dir": str(tmp_path)})
    finally:
        worker.close()
    assert reply["ok"] is False and reply["torch_loaded"] is False


def test_the_longest_sources_are_built_first(tmp_path):
    # In program order a model's long kernels (depthwise windows) could come last and end the batch
    # alone; one worker shows the order the jobs are taken in.
    jobs = [{"backend": "halide", "name": name, "source": f"raise ValueError({'x' * length!r})\n",
             "cache_dir": str(tmp_path)} for name, length in (("short", 1), ("long", 50), ("middle", 10))]
    replies = compile_pool.run_jobs(jobs, 1)
    assert [r["name"] for r in replies] == ["long", "middle", "short"]
