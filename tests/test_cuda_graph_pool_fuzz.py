"""Random programs of CUDA-graphed calls over the CPU stand-in of tests/test_cuda_graph_callers.py (an
arena allocator: a replay that writes memory a held value occupies shows in that value): graphs
called in random orders, on fresh tensors or on earlier outputs, outputs kept for a random while. After
every call, every value still held must equal what it was when it was made (runtime/graph_pool.py's
replay rule and resets are what keep it so)."""
import gc
import random

import pytest
import torch

import test_cuda_graph_callers as standin
from smelt.runtime import cuda_graphs
from test_cuda_graph_callers import _CpuGraphedCall


def _graph(seed: int):
    torch.manual_seed(seed)
    scale = float(seed % 3 + 1)

    def call(args):
        w, x, y = args
        args.clear()
        with torch.no_grad():
            return (torch.tanh(x) * scale + y * w, x * y)
    return _CpuGraphedCall(call, f"g{seed}", lambda args: tuple(a.shape for a in args), (), ())


def _expected(graph_index, w, x, y):
    return (torch.tanh(x) * float(graph_index % 3 + 1) + y * w.detach(), x * y)


@pytest.fixture(autouse=True)
def _fresh_pool(monkeypatch):
    standin._pool = None
    monkeypatch.setattr(cuda_graphs, "_first_step", cuda_graphs._FirstStep())
    monkeypatch.setattr(cuda_graphs, "_live", [])
    yield
    standin._pool = None


@pytest.mark.parametrize("seed", range(12))
def test_held_values_survive_random_programs(seed):
    """Half the seeds pass one of two parameters (two layers calling each graph: recordings per
    caller, the first step's warm-ups), the other half a caller's own tensor (no parameter). Now and
    then Dynamo is reset (every graphed call forgets its recordings) or a graph is compiled anew (the
    old one freed): a pool closes only once no held value lies in it."""
    rng = random.Random(seed)
    pools = {}
    graphs = [_graph(k) for k in range(3)]
    layers = [torch.nn.Parameter(torch.full((1, 8), float(k + 1))) for k in range(2)]
    held: list[tuple[torch.Tensor, torch.Tensor]] = []  # (value, its contents when it was made)
    for _ in range(160):
        x, y = (held[rng.randrange(len(held))][0] if held and rng.random() < 0.6 else torch.randn(4, 8)
                for _ in range(2))
        w = layers[rng.randrange(2)] if seed % 2 else torch.ones(1, 8)
        index = rng.randrange(len(graphs))
        expected = _expected(index, w, x, y)
        outputs = graphs[index]([w, x, y])
        for out, want in zip(outputs, expected):
            torch.testing.assert_close(out, want)
            if rng.random() < 0.5:
                held.append((out, want.clone()))
        del outputs, out, x, y, w
        for _ in range(rng.randrange(3)):  # a few values dropped, at random
            if held:
                del held[rng.randrange(len(held))]
        if len(held) > 12:
            del held[0]
        event = rng.random()
        if event < 0.03:
            if rng.random() < 0.5:
                held.clear()  # a step's end: nothing kept
            cuda_graphs.reset()
        elif event < 0.05:
            k = rng.randrange(len(graphs))
            replays = graphs[k].replays
            graphs[k] = _graph(k)  # the old call freed: its finalizer closes what only it used
            graphs[k].replays = replays
        if standin._pool is not None:
            pools[id(standin._pool)] = standin._pool
        for value, contents in held:
            torch.testing.assert_close(value, contents, msg="a held value was overwritten")
        value = contents = None  # the loop's last: not held
    assert sum(g.replays for g in graphs) > sum(g.recorded for g in graphs), "the programs barely replay"
    assert standin._pool is not None and (standin._pool.usable or standin._pool.closed), "a pool was retired"
    # At the program's end nothing is held and the graphs go: every pool it used closes.
    held.clear()
    pools[id(standin._pool)] = standin._pool
    del graphs
    gc.collect()
    assert all(p.closed for p in pools.values()) and cuda_graphs._live == [], "a pool outlived its calls"
