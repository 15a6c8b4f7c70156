"""Custom ops that mutate their arguments (`torch.library.custom_op(..., mutates_args=...)`).

Functionalization hands them over as `auto_functionalized_v2(op, **kwargs)` (`auto_functionalized`
on older torch or in export): a functional call that clones the bases of the tensors `op` mutates,
runs `op` on views of the clones and returns `op`'s outputs followed by the new bases. A mutated graph
input is then written back by the graph's own `copy_` (extern_calls.copy_).

The arguments' conventions differ by torch version and by kind of op (the views of a base are
described by `_<arg>_base_index` with slice/as_strided/alias keys; out= ops pass `_<arg>_size`,
`_<arg>_dtype`... and no bases), so the extern call is the functional HOP itself, run by torch's
own eager kernel for it: it reads those conventions as the torch that traced them wrote them.
smelt hands it the bases realized in their traced layout, since the views are regenerated from
them with the traced strides and offsets. One ATen call with side effects: kept in program order,
never dropped, even when nothing reads what it returns (the op may print, count, log).
"""
from __future__ import annotations

import logging

import torch

from ..errors import LoweringError
from ..ir import TensorBox
from ..ir.views import ReinterpretView
from ..symbolic import sympify
from .extern_nodes import make_extern
from .registry import lowering

log = logging.getLogger("smelt.lowering")

FUNCTIONAL_HOPS = tuple(getattr(torch.ops.higher_order, name) for name in ("auto_functionalized",
                                                                             "auto_functionalized_v2")
                        if hasattr(torch.ops.higher_order, name))


@lowering(*FUNCTIONAL_HOPS)
def auto_functionalized(g, mutable_op, **kwargs):
    hop = g.node.target
    if not isinstance(mutable_op, torch._ops.OpOverload):
        # A HOP whose subgraph mutates (its schema is a TreeSpec in `_op_schema`): no printable call.
        raise LoweringError(f"smelt: {hop.name()} around {mutable_op} (not an op overload) is not supported; "
                            f"`{g.node.format_node()}`")
    log.debug("smelt: %s runs through its ATen kernel on clones of the bases it mutates (%s)", mutable_op,
              hop.name())
    g.fallback_ops.append(str(mutable_op))
    result = make_extern(g, hop, (mutable_op,), kwargs, is_fallback=True, has_side_effects=True)
    _check_bases_as_traced(g, hop, mutable_op)
    return result


def _check_bases_as_traced(g, hop, mutable_op) -> None:
    """The op's arguments are regenerated from the bases with the traced strides: a base smelt
    could not realize with them would make the op write the wrong elements."""
    extern = next(b for b in reversed(g.buffers) if getattr(b, "op", None) is hop)
    traced = g.node.kwargs.get("_all_bases", [])
    for base, node in zip(extern.kwargs.get("_all_bases", []), traced):
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(meta, torch.Tensor) or isinstance(base, TensorBox):
            continue
        layout = base.layout
        same = list(layout.size) == [sympify(s) for s in meta.size()] and all(
            n == 1 or a == sympify(b) for n, a, b in zip(layout.size, layout.stride, meta.stride()))
        if isinstance(base, ReinterpretView) and layout.offset != sympify(meta.storage_offset()):
            same = False
        if not same:
            raise LoweringError(f"smelt: {mutable_op} mutates a base smelt realized as {layout}, not in its "
                                f"traced layout (size {list(meta.size())}, stride {list(meta.stride())}); "
                                f"`{g.node.format_node()}`")
