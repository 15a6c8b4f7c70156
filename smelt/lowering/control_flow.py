"""torch.cond: each branch compiled by smelt as a graph of its own, chosen at run time."""
from __future__ import annotations

import sympy
import torch

from ..errors import LoweringError
from ..ir import TensorBox
from ..ir.control_flow import Conditional
from ..symbolic import sympify
from .extern_nodes import outputs_of
from .registry import lowering


@lowering(torch.ops.higher_order.cond)
def cond(g, predicate, true_gm, false_gm, operands):
    if g.compile_subgraph is None:
        raise LoweringError("smelt: torch.cond's branches are compiled by the pipeline; lower_graph was called "
                            "without compile_subgraph")
    operands = [g.realize(o) if isinstance(o, TensorBox) else o for o in operands]
    examples = [n.meta.get("val") for n in g.node.args[3]]
    branches = []
    index = len(g.subgraphs) // 2
    for label, gm, attribute in (("true", true_gm, g.node.args[1]), ("false", false_gm, g.node.args[2])):
        name = f"cond{index}_{label}_branch"
        g.subgraphs[name] = g.compile_subgraph(gm, examples, name)
        g.subgraph_sources[name] = {"module": attribute.target, "operands": [n.name for n in g.node.args[3]]}
        branches.append(name)
    if isinstance(predicate, TensorBox):
        predicate = g.realize(predicate)
    elif not isinstance(predicate, (bool, sympy.Basic)):
        predicate = sympify(predicate)
    node = Conditional(g.new_name(), predicate, branches[0], branches[1], operands, g.origin)
    g.register_buffer(node)
    return outputs_of(g, node, g.out_meta)
