"""Inputs a training graph mutates are saved for the backward as copies.

AOTAutograd applies a forward's input mutations after the compiled forward returns (it copies the
new values into the caller's tensors), and the min-cut partitioner may save a primal input for
the backward to recompute from. When that input is one the forward mutates, the backward then
reads the mutated value: `batch_norm(x, ..., bias=b); b.mul_(2)` gave the next op's weight
gradient as if computed with the doubled bias (Inductor does too, torch 2.11-2.13). The forward
saves a copy taken before the mutation instead.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def copy_mutated_inputs_saved_for_backward(gm: torch.fx.GraphModule) -> int:
    """Replaces each value the forward saves for the backward that is a data-mutated input, or a
    view of one, by a clone of it; returns how many were replaced."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return 0
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    first = len(meta.tokens)  # effect tokens come first, then the flat inputs in order
    if len(placeholders) < first + len(meta.input_info):
        return 0
    mutated = {placeholders[first + i] for i, info in enumerate(meta.input_info) if info.mutates_data}
    output = gm.graph.find_nodes(op="output")[0]
    values = output.args[0]
    # Only what it saves is copied (a user output aliasing an input is regenerated from it by
    # AOTAutograd, with the output's strides).
    saved = values[saved_outputs_start(meta):]
    aliasing = [v for v in saved if isinstance(v, torch.fx.Node) and _base(v) in mutated]
    if not aliasing:
        return 0
    copies = {}
    for v in aliasing:
        if v not in copies:
            with gm.graph.inserting_after(v):
                copy = gm.graph.call_function(torch.ops.aten.clone.default, (v,))
            copy.meta = dict(v.meta)
            copies[v] = copy
    kept = values[:len(values) - len(saved)]
    output.args = (tuple(kept) + tuple(copies.get(v, v) for v in saved),) + tuple(output.args[1:])
    gm.recompile()
    log.debug("smelt: the forward saves copies of %d mutated inputs for the backward: %s",
              len(copies), ", ".join(v.name for v in copies))
    return len(copies)


def saved_outputs_start(meta=None) -> int | None:
    """Where a forward's outputs saved for the backward begin (AOTAutograd's fw_metadata, the
    current compile's when not given); None outside a training compile. A forward returns effect
    tokens, new values of mutated inputs, user outputs, intermediate bases and an rng offset, then
    what it saves for the backward."""
    if meta is None:
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    return None if meta is None else len(meta.tokens) + meta.num_forward


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage `node` aliases, through view ops (select, slice, t, view...)."""
    while node.op == "call_function" and _is_view(node.target) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _is_view(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def donated_saved_inputs(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The backward's placeholders that AOTAutograd donates: saved activations nothing outside the
    backward holds (no alias of a forward input or output), so their memory may be written over
    once read for the last time. They are never read twice: a backward first run under
    `retain_graph=True` is compiled with none, and AOTAutograd refuses `retain_graph=True` on one
    compiled with some (torch._functorch.config.donated_buffer, torch 2.11-2.13)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    indices = getattr(meta, "bw_donated_idxs", None) or ()
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    # AOTAutograd's list leaves out aliases of the forward's inputs and outputs, not of one another
    # (two saved views of one product): a write over one would change what the other reads.
    storages: dict = {}
    for node in placeholders:
        storage = _storage_of(node)
        if storage is not None:
            storages[storage] = storages.get(storage, 0) + 1
    return frozenset(placeholders[i].name for i in indices if 0 <= i < len(placeholders)
                     and storages.get(_storage_of(placeholders[i]), 0) == 1)


def _storage_of(node: torch.fx.Node):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.is_sparse:
        return None
    from torch.multiprocessing.reductions import StorageWeakRef
    return StorageWeakRef(val.untyped_storage())
