"""Copies that copy nothing anyone could tell apart, dropped before lowering.

Decompositions leave `clone` calls behind: dropout in eval mode is `input.clone()`, so every MLP of
a timm model in inference copies its activation before the second product. ConvNeXt-tiny (batch
32) copied three 147 MiB activations that way, and each copy held two of them alive at once: the
whole of its peak above Inductor's. A clone whose input is a fresh tensor (made by an op that
returns new memory, or a view of one) read by nothing else keeps the same values in the same
layout, and no one holds the original to see the two apart: its readers can read the input instead.
"""
from __future__ import annotations

import torch

from ..ir.extern import returns_new_memory

aten = torch.ops.aten


def drop_redundant_clones(gm: torch.fx.GraphModule) -> int:
    """Replaces such clones by their inputs, in place; returns how many went."""
    dropped = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.clone.default)):
        source = node.args[0] if node.args else None
        if _redundant(node, source):
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.recompile()
    return dropped


def _redundant(clone: torch.fx.Node, source) -> bool:
    if not isinstance(source, torch.fx.Node) or not _owned(source):
        return False
    # Preserving the layout: a clone to another memory format is a real relayout.
    if clone.kwargs.get("memory_format", torch.preserve_format) is not torch.preserve_format:
        return False
    # A clone the graph returns stays unless its input is itself new memory: a view of an
    # intermediate handed to the caller (and saved for the backward as another tensor object)
    # lets an in-place write to the output reach what the backward reads, silently, and an ATen
    # view returned from the compiled autograd function refuses in-place writes at all.
    if any(user.op == "output" for user in clone.users) and not _fresh(source):
        return False
    mine, theirs = clone.meta.get("val"), source.meta.get("val")
    # The storage offset too: `as_strided` after the clone addresses storage from its start.
    return isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) \
        and mine.dtype == theirs.dtype and mine.shape == theirs.shape and mine.stride() == theirs.stride() \
        and mine.storage_offset() == theirs.storage_offset()


def _owned(node: torch.fx.Node) -> bool:
    """Whether `node` is read by one user alone and is new memory, or a view of such a value through
    views each read once (ConvNeXt's layer scale clones a reshaped product)."""
    while len(node.users) == 1:
        if _fresh(node):
            return True
        target = node.target
        if not (node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target.is_view
                and node.args and isinstance(node.args[0], torch.fx.Node)):
            return False
        node = node.args[0]
    return False


def _fresh(node: torch.fx.Node) -> bool:
    """Whether `node` is an ATen call of one result in new memory (not a view, not an alias of an
    argument, not a graph input)."""
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
        and len(target._schema.returns) == 1 and returns_new_memory(target)
