"""What CUDA graphs (runtime/cuda_graphs.py) read, and how they are asked for, checked on the CPU:
torch.compile's mode and options, the facts each wrapper states about its graph, and CPU graphs
left as they are. The recordings themselves are tested on the GPU (tests/gpu/test_cuda_graphs.py)."""
import re

import pytest
import torch

import smelt
from smelt.config import SettingError
from smelt.runtime.cuda_graphs import GraphedCall

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]


def _only_graph(observe):
    graphs = observe.compiled_graphs()
    assert len(graphs) == 1, graphs
    return graphs[0]


def _fact(source: str, name: str):
    match = re.search(rf"^{name} = (.*)$", source, re.M)
    assert match, f"{name} missing from the wrapper:\n{source}"
    return eval(match.group(1))


@pytest.mark.parametrize("mode", ["fast", "reduce_overhead"])
def test_an_unknown_mode_names_the_accepted_ones(mode):
    torch._dynamo.reset()
    with pytest.raises(Exception, match="reduce-overhead, max-autotune") as info:
        torch.compile(torch.sin, backend="smelt", mode=mode)(torch.ones(3))
    assert mode in str(info.value)


def test_an_unknown_option_is_named():
    torch._dynamo.reset()
    with pytest.raises(Exception, match="'cuda_graph' not accepted.*cuda_graphs"):
        torch.compile(torch.sin, backend="smelt", options={"cuda_graph": True})(torch.ones(3))


def test_options_are_settings_of_the_compile(observe):
    torch._dynamo.reset()
    observe.reset()
    x = torch.randn(64)
    out = torch.compile(lambda x: x.cos() + 1, backend="smelt", options={"eviction_hints": False})(x)
    torch.testing.assert_close(out, x.cos() + 1)


def test_cpu_graphs_run_as_they_are_under_reduce_overhead(observe):
    torch._dynamo.reset()
    observe.reset()
    compiled = torch.compile(lambda x: torch.tanh(x) * 3, backend="smelt", mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(33)
        torch.testing.assert_close(compiled(x), torch.tanh(x) * 3)
    graph = _only_graph(observe)
    assert not isinstance(graph.call, GraphedCall)
    assert _fact(graph.wrapper_source, "CUDA_GRAPH_BLOCKERS") == ("it has CPU tensors",)


def test_wrapper_states_the_inputs_it_writes_and_its_sizes(observe):
    torch._dynamo.reset()
    observe.reset()

    def f(x, y):
        y.add_(1)
        return x.sum(0) * 2

    x, y = torch.randn(6, 5), torch.zeros(3)
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(f, backend="smelt")(x, y)
    graph = _only_graph(observe)
    source = graph.wrapper_source
    names = re.search(r"^    (.*) = args$", source, re.M).group(1).replace(" ", "").rstrip(",").split(",")
    written = _fact(source, "MUTATED_INPUTS")
    assert len(written) == 1 and names[written[0]] != "" and y.eq(1).all()
    # y (shape [3]) is the only input written; the size key is x's row count, however it is passed.
    namespace = {}
    exec(re.search(r"^def size_key\(args\):\n.*\n", source, re.M).group(0), namespace)
    args = [torch.zeros(3), 6, torch.zeros(6, 5)] if len(names) == 3 else [torch.zeros(3), torch.zeros(6, 5)]
    assert namespace["size_key"](args) == (6,)


def test_host_reads_are_named_as_blockers(observe):
    torch._dynamo.reset()
    observe.reset()
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        x = torch.randn(8)
        torch.testing.assert_close(torch.compile(lambda x: x[x > 0] * 2, backend="smelt")(x), x[x > 0] * 2)
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False
    blockers = [b for g in observe.compiled_graphs() for b in _fact(g.wrapper_source, "CUDA_GRAPH_BLOCKERS")]
    assert any("a size depends on the data (aten.index" in b for b in blockers), blockers
