"""Extern nodes: an ATen (or smelt) op called from the wrapper on realized tensors, with its outputs
described by the traced values. Every lowering that hands an op to a library builds its node here."""
from __future__ import annotations

import torch

from ..ir import ExternKernel, MultiOutput, StorageBox, TensorBox
from ..symbolic import sympify
from .common import layout_of
from .traced_layout import realize_as_traced


def _realize_args(g, value, traced=None):
    """Tensor arguments realized in their traced layouts (lowering/traced_layout.py): an ATen op's
    output layout follows its inputs', and the extern's output is planned from the traced output.
    `traced` is the same structure of FX nodes, where known."""
    if isinstance(value, (list, tuple)):
        traced = traced if isinstance(traced, (list, tuple)) and len(traced) == len(value) else [None] * len(value)
        return type(value)(_realize_args(g, v, t) for v, t in zip(value, traced))
    if not isinstance(value, TensorBox):
        return value
    if isinstance(traced, torch.fx.Node):
        return realize_as_traced(g, value, traced)
    return g.realize(value)


def make_extern(g, op, args, kwargs, is_fallback: bool, meta=None, has_side_effects: bool = False, traced=None):
    """Run `op` through ATen, its tensor inputs realized, its outputs described by `meta` (by
    default the FX node's). `traced`: the FX nodes `args` are the values of, where the op is not the
    node's own but takes its arguments (smelt::onednn_linear for an addmm)."""
    # The FX node's arguments describe `args` only when the extern is the node's own op on its own
    # arguments (a with_effects wrapper or a foreach position passes others).
    own = isinstance(g.node, torch.fx.Node) and op is g.node.target
    traced_args, traced_kwargs = (tuple(g.node.args), dict(g.node.kwargs)) if own else (traced, {})
    args = _realize_args(g, tuple(args), traced_args)
    kwargs = {k: _realize_args(g, v, traced_kwargs.get(k)) for k, v in kwargs.items()}
    meta = g.out_meta if meta is None else meta
    # An op that returns nothing (a check like _linalg_check_errors) is called for its effect, and
    # one that writes into an argument (copy_ into a CPU input from a GPU value) for its write.
    has_side_effects = has_side_effects or (isinstance(op, torch._ops.OpOverload)
                                            and (not op._schema.returns or op._schema.is_mutable))
    origins = g.origin
    if isinstance(meta, torch.Tensor):
        node = ExternKernel(g.new_name(), layout_of(meta), op, args, kwargs, origins, is_fallback)
        node.storage_offset = sympify(meta.storage_offset())
        node.has_side_effects = has_side_effects
        g.register_buffer(node)
        return TensorBox(StorageBox(node))
    node = ExternKernel(g.new_name(), None, op, args, kwargs, origins, is_fallback)
    node.has_side_effects = has_side_effects
    g.register_buffer(node)
    return outputs_of(g, node, meta)


def outputs_of(g, node, meta):
    """One MultiOutput per tensor in a step's nested results, described by `meta`."""
    def outputs(value, path):
        if isinstance(value, torch.Tensor):
            out = MultiOutput(g.new_name(), layout_of(value), node, path)
            out.storage_offset = sympify(value.storage_offset())
            g.register_buffer(out)
            return TensorBox(StorageBox(out))
        if isinstance(value, (list, tuple)):
            return type(value)(outputs(v, path + (k,)) for k, v in enumerate(value))
        return value
    return outputs(meta, ())
