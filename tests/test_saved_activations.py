"""What the min-cut partitioner sees of a training graph, where smelt's graph once made it save more
than it saves for Inductor: an embedding decomposed into a gather it would recompute, and
training's dropout of probability 0 (a clone) between the lookup and a layer norm. With both, it
saved the layer norms' float32 results in place of the lookup and a bfloat16 sum (Phi's AMP
training peak on the H200: 854.4 MB against Inductor's 847.0; benchmarks.probes.saved_activations
phi: 357.3 MiB against 356.3 at batch 2, sequence 256, now 356.4)."""
import copy

import torch
import torch.nn as nn
from functorch.compile import aot_function, make_boxed_func

from smelt.backend import _partition_joint_graph
from smelt.decompositions import decomposition_table

aten = torch.ops.aten


def _forward_ops(fn, *args) -> set:
    """The ATen ops of the forward graph smelt's partition gives its compiler for fn's training."""
    ops = set()

    def forward(gm, example_inputs):
        ops.update(n.target for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    compiled = aot_function(fn, fw_compiler=forward, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                            partition_fn=_partition_joint_graph, decompositions=decomposition_table())
    compiled(*args).sum().backward()
    return ops


def test_the_partitioner_sees_an_embedding_as_one_op_and_no_zero_dropout():
    weight = torch.randn(20, 8, requires_grad=True)
    ids = torch.tensor([[3, 1, 5], [2, 3, 19]])

    def fn(weight, ids):
        x = torch.nn.functional.dropout(torch.nn.functional.embedding(ids, weight), 0.0, training=True)
        return torch.nn.functional.layer_norm(x, (8,)) + x

    ops = _forward_ops(fn, weight, ids)
    assert aten.embedding.default in ops and aten.index.Tensor not in ops, ops
    assert aten.clone.default not in ops, ops


def test_the_embedding_trains_to_eagers_gradients(device, assert_close):
    # The lookup is its own op through AOTAutograd now: its values, and padding_idx's gradient.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 8, padding_idx=3), nn.LayerNorm(8)).to(device)
    ours = copy.deepcopy(model)
    ids = torch.tensor([[3, 1, 5], [3, 3, 19]], device=device)
    expected = model(ids)
    expected.square().sum().backward()
    torch._dynamo.reset()
    actual = torch.compile(ours, backend="smelt")(ids)
    actual.square().sum().backward()
    assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert_close(ours[0].weight.grad, model[0].weight.grad, atol=1e-5, rtol=1e-5)
    assert ours[0].weight.grad[3].abs().sum() == 0
