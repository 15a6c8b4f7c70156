"""Tensor layouts chosen for a graph before it is lowered: channels-last through convolution nets,
and aligned rows for matrix products (lowering/matmul_padding.py).

cuDNN's tensor-core convolutions read and write NHWC memory. Handed the NCHW tensors of a model
built the usual way, it converts the input and the weight to NHWC and its result back, on every
call: in ResNet-50 (bf16, batch 32) on the H100 those conversions took 0.59 of the 2.55 ms smelt
spent on the GPU. Where the backend's Target asks for it (`Target.channels_last_convolutions`, or
SMELT_CHANNELS_LAST=on), each 2-D convolution here gets its input and weight as channels-last
copies, and every value's traced layout is then worked out again as eager would lay it out given
those (lowering/fx_retrace.py: a pointwise op keeps its input's memory format). The lowering
realizes values in their traced layouts and the scheduler walks each pointwise kernel in its
output's memory order, so the norms, activations and pools between convolutions read and write
NHWC, and a copy is made once where a value first meets a convolution (the image, each weight).

At the graph's edges: what the caller sees (an inference graph's outputs, a forward's user
outputs, a backward's gradients) keeps eager's strides, through a copy where they changed, but for
a padded product's logits returned as the first columns of their padded rows (matmul_padding.py). What a
forward saves for its backward keeps a new dense layout: the strides are reported to AOTAutograd
(`TracingContext.report_output_strides`), which restrides the backward's example inputs, and
`restride_placeholders` carries them into the backward graph before it is planned in turn. A
saved value with gaps takes no such report: the first columns of padded rows are saved as the rows,
which the backward reads through the same slice (`read_padded_saved_rows`); any other is saved as a
dense copy.

Graphs with symbolic sizes are left as traced: AOTAutograd takes a forward's reported strides
as integers.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..saved_inputs import saved_outputs_start
from .common import is_dense
from .fx_retrace import Checkpoint, retrace
from .matmul_padding import pad_matmuls, products_into_copies, slice_arguments

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

# The operands of each convolution op that cuDNN wants in NHWC, by position.
_CONVOLUTION_OPERANDS = {
    aten.convolution.default: (0, 1),  # input, weight
    aten.convolution_backward.default: (0, 1, 2),  # grad_output, input, weight
}
# The weight's position: left as it is when it is a graph input (below).
_WEIGHT = {aten.convolution.default: 1, aten.convolution_backward.default: 2}


def restride_placeholders(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Give `gm`'s placeholders the strides of `example_inputs` where they differ (a backward's saved
    activations, restrided by AOTAutograd after the forward reported its layouts); the values
    computed from them are re-traced. True when something changed."""
    visible = _visible_outputs(gm, "backward")
    before = Checkpoint(gm)  # the placeholders' values change below
    traced: dict[torch.fx.Node, torch.Tensor] = {}
    for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(example, torch.Tensor) and _static(val) \
                and tuple(example.shape) == tuple(val.shape) and example.stride() != val.stride():
            traced[node] = val
            node.meta["val"] = example
    if not traced:
        return False
    if retrace(gm, before):
        _restore_visible_outputs(gm, visible)
    else:
        # An op whose fake kernel refuses the new strides (or that has none): the graph reads each
        # such input through a copy in its traced layout, made where a reader needs it in memory.
        log.debug("smelt: the backward reads %d saved values through copies in their traced layouts", len(traced))
        last_input = list(gm.graph.find_nodes(op="placeholder"))[-1]
        for node, val in traced.items():
            users = list(node.users)
            with gm.graph.inserting_after(last_input):  # inputs stay first in the graph
                copy = gm.graph.call_function(aten.clone.default, (node,))
            copy.meta = dict(node.meta, val=val)
            for user in users:
                user.replace_input_with(node, copy)
    gm.recompile()
    return True


class LayoutPlan(NamedTuple):
    """What a forward's plan tells the rest of the compile: the output strides to report to
    AOTAutograd, and the saved values returned as their padded rows (`_save_padded_rows`), by
    position among the saved values: (the columns the backward reads, the row length)."""
    output_strides: list
    padded_saved: dict[int, tuple[int, int]]


def plan_layouts(gm: torch.fx.GraphModule, kind: str, wants_channels_last, wants_padded_matmuls,
                 copies_weights=lambda device: False) -> LayoutPlan | None:
    """Channels-last convolutions where `wants_channels_last(device)` says so (a weight that is a
    graph input copied too where `copies_weights(device)` does), and aligned matrix product rows
    (lowering/matmul_padding.py) where `wants_padded_matmuls(device, dtype)` does; `kind` is
    "inference", "forward" or "backward". Changes `gm` in place; returns the plan when layouts
    changed (None otherwise)."""
    if not all(_static(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")):
        if any(n.op == "call_function" and n.target in _CONVOLUTION_OPERANDS for n in gm.graph.nodes):
            log.debug("smelt: channels-last layout not planned for a graph with symbolic sizes")
        return None
    visible = _visible_outputs(gm, kind)
    traced_strides = _output_strides(gm)
    before = Checkpoint(gm)
    conversions = _convert_convolution_operands(gm, wants_channels_last, copies_weights)
    padding = pad_matmuls(gm, wants_padded_matmuls)
    if not (conversions or padding) or not retrace(gm, before):
        return None
    if padding:
        gm.graph.eliminate_dead_code()  # products split along K leave their first form dead
    # Values made channels-last by an earlier convolution need no copy.
    for copy in conversions:
        if copy.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last):
            copy.replace_all_uses_with(copy.args[0])
            gm.graph.erase_node(copy)
    restored = _restore_visible_outputs(gm, visible)
    padded_saved = _save_padded_rows(gm, kind, restored)
    _make_saved_values_dense(gm, kind, visible, restored, traced_strides)
    if padding:
        copied = Checkpoint(gm)
        if products_into_copies(gm) and retrace(gm, copied):
            gm.graph.eliminate_dead_code()
    gm.recompile()
    log.debug("smelt: a %s graph's layouts planned: %d convolution operands copied to channels-last, "
              "%d nodes pad matrix product rows", kind, len(conversions), len(padding))
    start = saved_outputs_start() if padded_saved else None
    strides = _output_strides(gm)
    for j in padded_saved:  # AOTAutograd keeps the backward's example input as traced (it has no room for the pad)
        strides[start + j] = None
    return LayoutPlan(strides, padded_saved)


def _convert_convolution_operands(gm: torch.fx.GraphModule, wants, copies_weights) -> list[torch.fx.Node]:
    """A channels-last copy before each 2-D convolution of each operand not already so.

    A weight that is a graph input (a parameter) is left as it is unless `copies_weights(device)`:
    with a channels-last input ATen computes in channels-last and converts the weight itself, where
    this copy is a kernel launched from the wrapper on every call (Target.copies_convolution_weights).
    A weight the graph computes (an AMP cast) is written channels-last by its producer, at no extra
    cost."""
    conversions: dict[torch.fx.Node, torch.fx.Node] = {}
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target not in _CONVOLUTION_OPERANDS or not _is_4d(conv.args[0]) \
                or not wants(conv.args[0].meta["val"].device):
            continue
        if _crashes_onednn_channels_last(conv):
            _keep_in_nchw(gm, conv)
            continue
        for position in _CONVOLUTION_OPERANDS[conv.target]:
            operand = conv.args[position]
            if not _is_4d(operand) or operand.meta["val"].is_contiguous(memory_format=torch.channels_last):
                continue
            if position == _WEIGHT[conv.target] and operand.op == "placeholder" \
                    and not copies_weights(operand.meta["val"].device):
                continue
            if operand not in conversions:
                with gm.graph.inserting_before(conv):
                    conversions[operand] = gm.graph.call_function(
                        aten.clone.default, (operand,), {"memory_format": torch.channels_last})
            conv.update_arg(position, conversions[operand])
    return list(conversions.values())


def channels_last_weight_copies(gm: torch.fx.GraphModule, wants, weights: set) -> list[torch.fx.Node]:
    """For frozen weights (lowering/frozen_weights.py): the channels-last copy of each convolution
    weight in `weights` (computed from weights alone: a parameter, or its autocast cast, which
    `_convert_convolution_operands` would leave to ATen or to the cast's kernel), made in the
    graph, where the prologue can take it. Only for convolutions the plan makes channels-last (none where sizes are
    symbolic: the plan leaves those graphs as traced)."""
    if not all(_static(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")):
        return []
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default or not _is_4d(conv.args[0]) \
                or not wants(conv.args[0].meta["val"].device) or _crashes_onednn_channels_last(conv):
            continue
        weight = conv.args[_WEIGHT[conv.target]]
        if weight not in weights or not _is_4d(weight) \
                or weight.meta["val"].is_contiguous(memory_format=torch.channels_last):
            continue
        if weight not in copies:
            with gm.graph.inserting_before(conv):
                copies[weight] = gm.graph.call_function(
                    aten.clone.default, (weight,), {"memory_format": torch.channels_last})
            copies[weight].meta = dict(weight.meta, val=weight.meta["val"].clone(memory_format=torch.channels_last))
        conv.update_arg(_WEIGHT[conv.target], copies[weight])
    return list(copies.values())


def _crashes_onednn_channels_last(conv: torch.fx.Node) -> bool:
    """A bfloat16 convolution on the CPU with a stride and a dilation both above 1: oneDNN's
    channels-last kernel dies by signal 11 on some of them (torch 2.13: 69 of 3,024 small shapes,
    every one strided and dilated; `benchmarks/probes/onednn_channels_last_crash.py`), eager's own
    call with a channels-last input too."""
    val = conv.args[0].meta["val"]
    stride, dilation = (conv.args[3], conv.args[5]) if conv.target is aten.convolution.default \
        else (conv.args[4], conv.args[6])
    return val.device.type == "cpu" and val.dtype == torch.bfloat16 and any(s > 1 for s in stride) \
        and any(d > 1 for d in dilation)


def _keep_in_nchw(gm: torch.fx.GraphModule, conv: torch.fx.Node) -> None:
    """NCHW operands for `conv`, whatever layout the plan gives their producers (each copied to
    contiguous memory unless it is a graph input already so)."""
    copied = False
    for position in _CONVOLUTION_OPERANDS[conv.target]:
        operand = conv.args[position]
        if not _is_4d(operand) or (operand.op == "placeholder" and operand.meta["val"].is_contiguous()):
            continue
        with gm.graph.inserting_before(conv):
            copy = gm.graph.call_function(aten.clone.default, (operand,), {"memory_format": torch.contiguous_format})
        # Its value here: with no other layout change the plan traces nothing again (CPU fuzz seed
        # 2204: a strided weight's copy reached lowering with none).
        copy.meta = dict(operand.meta, val=operand.meta["val"].clone(memory_format=torch.contiguous_format))
        conv.update_arg(position, copy)
        copied = True
    if copied:
        gm.recompile()
    log.debug("smelt: %s keeps NCHW operands (oneDNN's channels-last bfloat16 kernel crashes on some "
              "strided, dilated shapes)", conv.name)


def _save_padded_rows(gm: torch.fx.GraphModule, kind: str, restored: dict) -> dict[int, tuple[int, int]]:
    """A forward's saved value that is the first columns of padded rows (a padded product's logits,
    saved for cross-entropy's backward) is saved as the padded rows themselves. AOTAutograd's
    backward takes no value with gaps, and a dense copy of the columns was a pass over the logits
    that then stood beside the backward's padded gradient at its peak (BERT's AMP step: 238 MiB).
    The backward reads the columns back through the same slice (`read_padded_saved_rows`). Returns
    {position among the saved values: (columns, row length)}."""
    start = saved_outputs_start() if kind == "forward" else None
    if start is None:
        return {}
    output = gm.graph.find_nodes(op="output")[0]
    values = list(output.args[0])
    padded: dict[int, tuple[int, int]] = {}
    for i in range(start, len(values)):
        node = values[i]
        if not isinstance(node, torch.fx.Node) or (node in restored and is_dense(restored[node].meta["val"])):
            continue  # the copy the caller gets is saved (_make_saved_values_dense)
        base = _padded_rows_of(node)
        if base is not None:
            values[i] = base
            padded[i - start] = (node.meta["val"].shape[-1], base.meta["val"].shape[-1])
    output.args = (tuple(values),) + tuple(output.args[1:])
    return padded


def _padded_rows_of(node: torch.fx.Node):
    """The contiguous rows `node` is the first columns of (`slice(rows, -1, 0, n)`), or None."""
    if node.target is not aten.slice.Tensor or node.kwargs:
        return None
    base, dim, start, _, step = slice_arguments(node)
    val, rows = node.meta.get("val"), base.meta.get("val") if isinstance(base, torch.fx.Node) else None
    if not (isinstance(val, torch.Tensor) and isinstance(rows, torch.Tensor) and _static(val) and _static(rows)):
        return None
    last = rows.dim() - 1
    if dim not in (-1, last) or start not in (0, None) or step != 1 or not rows.is_contiguous() \
            or tuple(rows.shape[:-1]) != tuple(val.shape[:-1]) or not 0 < val.shape[-1] < rows.shape[-1]:
        return None
    return base


def read_padded_saved_rows(gm: torch.fx.GraphModule, example_inputs, padded: dict[int, tuple[int, int]]) -> list:
    """The backward's half of `_save_padded_rows`: each saved value the forward returns as its padded
    rows arrives so; its placeholder becomes those rows, read through a slice of their first
    columns. Returns the example inputs with those rows in place of the values."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    # AOTAutograd passes the saved sizes (symbolic graphs) first, then the saved tensors.
    first = next((k for k, p in enumerate(placeholders) if isinstance(p.meta.get("val"), torch.Tensor)), 0)
    inputs = list(example_inputs)
    before = Checkpoint(gm)
    traced = {}
    for j, (columns, width) in sorted(padded.items()):
        node = placeholders[first + j]
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) and _static(val) and val.is_contiguous() and val.shape[-1] == columns):
            raise RuntimeError(f"smelt: the backward's saved input {node.name} ({getattr(val, 'shape', val)}) is not "
                               f"the {columns} columns the forward saved as padded rows")
        traced[node] = val
        node.meta["val"] = inputs[first + j] = inputs[first + j].new_empty((*val.shape[:-1], width))
        _read_columns(gm, node, placeholders[-1], columns)
    if not retrace(gm, before):
        # A reader whose fake kernel refuses the view: it reads a copy in the traced layout instead.
        for node, val in traced.items():
            view = _read_columns(gm, node, placeholders[-1], val.shape[-1])
            view.meta["val"] = node.meta["val"][..., :val.shape[-1]]
            with gm.graph.inserting_after(view):
                copy = gm.graph.call_function(aten.clone.default, (view,), {"memory_format": torch.contiguous_format})
            copy.meta["val"] = val
            for user in list(view.users):
                if user is not copy:
                    user.replace_input_with(view, copy)
    gm.recompile()
    return inputs


def _read_columns(gm: torch.fx.GraphModule, rows: torch.fx.Node, after: torch.fx.Node, columns: int) -> torch.fx.Node:
    """Every reader of `rows` reads their first `columns` columns instead; returns that slice."""
    with gm.graph.inserting_after(after):  # inputs stay first in the graph
        view = gm.graph.call_function(aten.slice.Tensor, (rows, -1, 0, columns))
    for user in list(rows.users):
        if user is not view:
            user.replace_input_with(rows, view)
    return view


def _output_strides(gm: torch.fx.GraphModule) -> list:
    return [tuple(v.meta["val"].stride())
            if isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor) else None
            for v in gm.graph.find_nodes(op="output")[0].args[0]]


def _make_saved_values_dense(gm: torch.fx.GraphModule, kind: str, visible: dict, restored: dict,
                             traced_strides: list) -> None:
    """A forward's saved value whose new strides leave gaps (a padded row) is saved as a dense
    copy: AOTAutograd restrides the backward's example input, whose storage is only dense-sized.
    One traced with gaps and still so strided (q, k and v, views of one projection's output, as
    SDPA saves them) keeps its example input as traced: saved as it is, not copied (a copy made
    ViT's and GPT-2's forwards copy q, k and v at their end, beside the projection)."""
    if kind != "forward":
        return
    output = gm.graph.find_nodes(op="output")[0]
    values = list(output.args[0])
    for i, node in enumerate(values):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if i in visible or not isinstance(val, torch.Tensor) or is_dense(val) \
                or tuple(val.stride()) == traced_strides[i]:
            continue
        if node in restored and is_dense(restored[node].meta["val"]):
            values[i] = restored[node]  # also returned to the caller: that copy is saved
            continue
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
        copy.meta = dict(node.meta, val=val.clone(memory_format=torch.contiguous_format))
        values[i] = copy
    output.args = (tuple(values),) + tuple(output.args[1:])


def _visible_outputs(gm: torch.fx.GraphModule, kind: str) -> dict[int, torch.Tensor]:
    """Output positions whose strides the caller sees, with their traced values: all of them but
    what a forward saves for its backward."""
    values = gm.graph.find_nodes(op="output")[0].args[0]
    count = len(values)
    start = saved_outputs_start() if kind == "forward" else None
    if start is not None:
        count = min(count, start)
    return {i: values[i].meta.get("val") for i in range(count) if isinstance(values[i], torch.fx.Node)}


def _restore_visible_outputs(gm: torch.fx.GraphModule, visible: dict[int, torch.Tensor]) -> dict:
    """Copies of the outputs the caller sees whose strides changed, in eager's; returns them by node."""
    output = gm.graph.find_nodes(op="output")[0]
    values = list(output.args[0])
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    # Outputs that cover their eager storage first: another output eager returns as a view into that
    # storage is taken over the first one's copy.
    order = sorted(visible.items(), key=lambda item: not _covers_its_storage(item[1]))
    bases: list[tuple[torch.Tensor, torch.fx.Node]] = []  # (eager's value, its copy)
    for i, traced in order:
        node = values[i]
        now = node.meta.get("val")
        if not isinstance(traced, torch.Tensor) or not isinstance(now, torch.Tensor) or now.stride() == traced.stride():
            continue
        base = next((copy for value, copy in bases if _same_storage(value, traced)), None)
        if node not in copies and base is not None and _static(traced):
            # Copied apart, a write to one would not show in the other (found by the fuzzer with every
            # product padded: `v0 = where(...); bmm(v0, w); return v0, v0.movedim(2, 0)`). The base's copy
            # has eager's strides and offset 0, so eager's view applies over it.
            with gm.graph.inserting_before(output):
                copies[node] = gm.graph.call_function(
                    aten.as_strided.default, (base, list(traced.shape), list(traced.stride()), traced.storage_offset()))
            copies[node].meta = dict(node.meta, val=traced)
        if node not in copies:
            # A copy whose traced value has eager's strides: the lowering realizes outputs in those.
            with gm.graph.inserting_before(output):
                copies[node] = gm.graph.call_function(aten.clone.default, (node,))
            copies[node].meta = dict(node.meta, val=traced)
            if _covers_its_storage(traced):
                bases.append((traced, copies[node]))
        values[i] = copies[node]
    output.args = (tuple(values),) + tuple(output.args[1:])
    return copies


def _covers_its_storage(value) -> bool:
    """Whether a traced value is its whole storage, densely, from offset 0 (a result eager made anew)."""
    return isinstance(value, torch.Tensor) and _static(value) and value.storage_offset() == 0 and is_dense(value) \
        and value.untyped_storage().nbytes() == value.numel() * value.element_size()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _is_4d(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 4 and val.layout == torch.strided


def _static(val) -> bool:
    if not isinstance(val, torch.Tensor):
        return not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))
    return all(isinstance(s, int) for s in (*val.shape, *val.stride(), val.storage_offset()))
