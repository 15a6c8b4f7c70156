"""lowering/written_in_place.py: whether a Dynamo graph writes a value in place, through views."""
import operator

import pytest
import torch
import torch.nn.functional as F

from conftest import dynamo_graph
from smelt.lowering.written_in_place import written_in_place


def _source(gm):  # the value under test: the graph's first tanh
    return next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.tanh)


WRITES = {
    "method": lambda y: y.add_(1),
    "through a slice": lambda y: y[:, ::2].clamp_(min=0),
    "through a view chain": lambda y: y.view(4, 2).t()[0].mul_(2),
    "setitem": lambda y: y.__setitem__(0, 1.0),
    "augmented": lambda y: operator.iadd(y, 1),
    "inplace keyword": lambda y: F.relu(y, inplace=True),
    "out keyword": lambda y: torch.mul(y, 2, out=y),
}
READS = {
    "a copy written": lambda y: y.clone().add_(1),
    "read by an in-place op on another": lambda y: torch.zeros(2, 4).add_(y),
    "out of place": lambda y: y.add(1),
}


@pytest.mark.parametrize("name", WRITES)
def test_writes_through_the_value_or_its_views_are_found(name):
    def fn(x):
        y = torch.tanh(x)
        WRITES[name](y)
        return y * 1
    assert written_in_place(_source(dynamo_graph(fn, torch.randn(2, 4))))


@pytest.mark.parametrize("name", READS)
def test_reads_and_writes_of_copies_are_not(name):
    def fn(x):
        y = torch.tanh(x)
        return READS[name](y), y * 1
    assert not written_in_place(_source(dynamo_graph(fn, torch.randn(2, 4))))
