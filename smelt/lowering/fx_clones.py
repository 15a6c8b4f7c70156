"""Copies that copy nothing anyone could tell apart, dropped before lowering.

Decompositions leave `clone` calls behind: dropout in eval mode is `input.clone()`, so every MLP of
a timm model in inference copies its activation before the second product. ConvNeXt-tiny (batch
32) copied three 147 MiB activations that way, and each copy held two of them alive at once: the
whole of its peak above Inductor's. A clone whose input is a fresh tensor (made by an op that
returns new memory, or a view of one) read by nothing else keeps the same values in the same
layout, and no one holds the original to see the two apart: its readers can read the input instead.

A copy into another layout goes too where every reader takes any layout (the fused attention
kernels' query, key and value): the layouts after it are traced again, since an attention's output
follows its query's.
"""
from __future__ import annotations

import operator

import torch

from ..ir.extern import returns_new_memory
from .fx_retrace import Checkpoint, retrace

aten = torch.ops.aten

# Readers that take these operands in any layout whose last dimension is dense and whose other
# strides and offset are whole 16-byte units: the fused attention kernels, at query, key and value.
# Whisper and BART copy each head-major view (`.transpose(1, 2).contiguous()`) before attention:
# three copies a layer, and cuDNN's output then follows the copied query's layout, so the output's
# way back (`.transpose(1, 2).contiguous()` again) is one more.
# In a training graph their backwards read the same copies (their gradients then take the view's
# layout too, so the gradient's way back to the projections' rows needs no copy either).
_LAYOUT_FREE_OPERANDS = {
    aten._scaled_dot_product_cudnn_attention.default: (0, 1, 2),
    aten._scaled_dot_product_flash_attention.default: (0, 1, 2),
    aten._scaled_dot_product_efficient_attention.default: (0, 1, 2),
    aten._scaled_dot_product_cudnn_attention_backward.default: (1, 2, 3),
    aten._scaled_dot_product_flash_attention_backward.default: (1, 2, 3),
    aten._scaled_dot_product_efficient_attention_backward.default: (1, 2, 3),
}


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


def drop_copies_before_layout_free_readers(gm: torch.fx.GraphModule) -> int:
    """Copies read only by operands that take any (aligned, last-dimension dense) layout: the readers
    read the copy's input instead, and the layouts after them are traced again (an attention's
    output follows its query's); then copies that became layout-preserving go too. Returns how many
    copies went."""
    before = Checkpoint(gm)
    skipped = []
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.clone.default)):
        source = node.args[0] if node.args else None
        if isinstance(source, torch.fx.Node) and _owned(source) and _layout_free_readers(node) \
                and _aligned_rows(source.meta.get("val")):
            node.replace_all_uses_with(source)  # left in the graph until the re-trace holds
            skipped.append(node)
    if not skipped:
        return 0
    if not retrace(gm, before):
        return 0
    if _output_layouts(gm) != [_layout(before.values.get(n)) if isinstance(n, torch.fx.Node) else None
                                for n in _outputs(gm)]:
        # A forward's attention output saved for its backward, which was traced with the old layout.
        before.restore(gm, values=True)
        return 0
    for node in skipped:
        gm.graph.erase_node(node)
    gm.recompile()
    return len(skipped) + drop_redundant_clones(gm)


def _outputs(gm: torch.fx.GraphModule) -> list:
    out = gm.graph.output_node().args[0]
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _layout(value):
    return (tuple(value.stride()), value.storage_offset()) if isinstance(value, torch.Tensor) else None


def _output_layouts(gm: torch.fx.GraphModule) -> list:
    return [_layout(n.meta.get("val")) if isinstance(n, torch.fx.Node) else None for n in _outputs(gm)]


def _layout_free_readers(clone: torch.fx.Node) -> bool:
    users = list(clone.users)
    return bool(users) and all(
        user.target in _LAYOUT_FREE_OPERANDS and all(v is not clone for v in user.kwargs.values())
        and all(k in _LAYOUT_FREE_OPERANDS[user.target] for k, a in enumerate(user.args) if a is clone)
        for user in users)


def _aligned_rows(value) -> bool:
    """A 4-d layout the fused attention kernels read as is: dense last dimension, every other
    stride and the offset whole 16-byte units, static."""
    if not isinstance(value, torch.Tensor) or value.dim() != 4:
        return False
    unit = max(1, 16 // value.element_size())
    strides = value.stride()
    if not all(isinstance(x, int) for x in (*strides, *value.shape, value.storage_offset())):
        return False
    return strides[-1] == 1 and all(st % unit == 0 for st in strides[:-1]) and value.storage_offset() % unit == 0


def _redundant(clone: torch.fx.Node, source) -> bool:
    if not isinstance(source, torch.fx.Node) or not _owned(source):
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
    argument, not a graph input), or one result of a call whose results all are (an attention's output)."""
    target = node.target
    if node.op == "call_function" and target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        call = node.args[0]
        return call.op == "call_function" and isinstance(call.target, torch._ops.OpOverload) \
            and returns_new_memory(call.target)
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
        and len(target._schema.returns) == 1 and returns_new_memory(target)
