"""The torch.compile entry: Dynamo hands us an FX graph; AOTAutograd splits it into forward and
backward ATen graphs (min-cut partitioned) and each goes through smelt's pipeline."""
from __future__ import annotations

import functools

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition

from .decompositions import decomposition_table
from .pipeline import compile_graph

# Checks that return nothing: older torch (2.11) does not thread them through effect tokens, so
# without this mark FX dead-code elimination drops them and a singular matrix passes silently.
for _check in (torch.ops.aten._linalg_check_errors.default,):
    torch.fx.node.has_side_effect(_check)


def _compiler(kind: str):
    return functools.partial(_compile, kind=kind)


def _compile(gm, example_inputs, kind):
    return compile_graph(gm, example_inputs, kind)


def smelt_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=decomposition_table(),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs, **kwargs)
