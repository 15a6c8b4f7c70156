"""Tensor layouts chosen for a graph before it is lowered: channels-last through convolution nets.

cuDNN's tensor-core convolutions read and write NHWC memory. Handed the NCHW tensors of a model
built the usual way, it converts the input and the weight to NHWC and its result back, on every
call: in ResNet-18 on the H100 those conversions took 0.97 of the 2.84 ms smelt spent on the GPU.
Where the backend's Target asks for it (`Target.channels_last_convolutions`, or
SMELT_CHANNELS_LAST=on), each 2-D convolution here gets its input and weight as channels-last
copies, and every value's traced layout is then worked out again as eager would lay it out given
those (a pointwise op keeps its input's memory format). The lowering realizes values in their
traced layouts and the scheduler walks each pointwise kernel in its output's memory order, so
the norms, activations and pools between convolutions read and write NHWC, and a copy is made
once where a value first meets a convolution (the image, and each weight).

At the graph's edges: what the caller sees (an inference graph's outputs, a forward's user
outputs, a backward's gradients) keeps eager's strides, through a copy where they changed. What a
forward saves for its backward keeps the new layout: the strides are reported to AOTAutograd
(`TracingContext.report_output_strides`), which restrides the backward's example inputs, and
`restride_placeholders` carries them into the backward graph before it is planned in turn.

Graphs with symbolic sizes are left as traced: AOTAutograd takes a forward's reported strides
as integers.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

# The operands of each convolution op that cuDNN wants in NHWC, by position.
_CONVOLUTION_OPERANDS = {
    aten.convolution.default: (0, 1),  # input, weight
    aten.convolution_backward.default: (0, 1, 2),  # grad_output, input, weight
}
# View ops that fail on strides they cannot express: their input is made contiguous first.
_VIEWS = (aten.view.default, aten._unsafe_view.default)


def restride_placeholders(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Give `gm`'s placeholders the strides of `example_inputs` where they differ (a backward's saved
    activations, restrided by AOTAutograd after the forward reported its layouts); the values
    computed from them are re-traced. True when something changed."""
    changed = False
    visible = _visible_outputs(gm, "backward")
    for node, example in zip(gm.graph.find_nodes(op="placeholder"), example_inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(example, torch.Tensor) and _static(val) \
                and tuple(example.shape) == tuple(val.shape) and example.stride() != val.stride():
            node.meta["val"] = example
            changed = True
    if changed and not _retrace(gm, []):
        raise RuntimeError("smelt: the backward's inputs arrive in new layouts, and its graph could not be re-traced "
                           "with them")  # the forward reported them only after its own re-trace worked
    if changed:
        _restore_visible_outputs(gm, visible)
        gm.recompile()
    return changed


def plan_layouts(gm: torch.fx.GraphModule, kind: str, wants_channels_last) -> list | None:
    """Channels-last convolutions for `gm` where `wants_channels_last(device)` says so; `kind` is
    "inference", "forward" or "backward". Returns the forward's output strides to report to
    AOTAutograd when layouts changed (None otherwise), and changes `gm` in place."""
    convolutions = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _CONVOLUTION_OPERANDS
                    and _is_4d(n.args[0]) and wants_channels_last(n.args[0].meta["val"].device)]
    if not convolutions:
        return None
    if not all(_static(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder")):
        log.debug("smelt: channels-last layout not planned for a graph with symbolic sizes")
        return None
    visible = _visible_outputs(gm, kind)
    conversions: dict[torch.fx.Node, torch.fx.Node] = {}
    for conv in convolutions:
        for position in _CONVOLUTION_OPERANDS[conv.target]:
            operand = conv.args[position]
            if not _is_4d(operand) or operand.meta["val"].is_contiguous(memory_format=torch.channels_last):
                continue
            if operand not in conversions:
                with gm.graph.inserting_before(conv):
                    conversions[operand] = gm.graph.call_function(
                        aten.clone.default, (operand,), {"memory_format": torch.channels_last})
            conv.update_arg(position, conversions[operand])
    if not conversions:
        return None
    if not _retrace(gm, list(conversions.values())):
        return None
    # Values made channels-last by an earlier convolution need no copy.
    for copy in conversions.values():
        if copy.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last):
            copy.replace_all_uses_with(copy.args[0])
            gm.graph.erase_node(copy)
    _restore_visible_outputs(gm, visible)
    gm.recompile()
    log.debug("smelt: %d convolutions of a %s graph run in channels-last (%d operands converted)",
              len(convolutions), kind, len(conversions))
    output = gm.graph.find_nodes(op="output")[0]
    return [tuple(v.meta["val"].stride()) if isinstance(v, torch.fx.Node) and isinstance(v.meta.get("val"), torch.Tensor)
            else None for v in output.args[0]]


def _retrace(gm: torch.fx.GraphModule, inserted: list[torch.fx.Node]) -> bool:
    """Trace every value's layout again from the placeholders' (fake tensors, the graph's own fake
    mode) and keep the results; on failure leave the metadata alone, remove `inserted` and return
    False. A view the new strides cannot express gets a contiguous copy of its input."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if fake_mode is None:
        _remove(gm, inserted)
        return False
    env: dict[torch.fx.Node, object] = {}
    try:
        with fake_mode:
            for node in list(gm.graph.nodes):
                if node.op == "placeholder":
                    env[node] = node.meta.get("val")
                elif node.op == "get_attr":  # a constant's fake value, or a subgraph module
                    env[node] = node.meta["val"] if "val" in node.meta else _attribute(gm, node.target)
                elif node.op == "call_function":
                    env[node] = _run(gm, node, env, inserted)
                elif node.op != "output":
                    raise NotImplementedError(f"FX node kind {node.op}")
    except Exception as e:  # an op without a fake kernel, a data-dependent size: plan nothing
        log.debug("smelt: layouts not re-traced (%s: %s); the graph keeps its traced layouts", type(e).__name__, e)
        _remove(gm, inserted)
        return False
    for node, val in env.items():
        if node.op == "call_function" and val is not None:
            node.meta["val"] = val
    return True


def _run(gm, node: torch.fx.Node, env: dict, inserted: list):
    def value(a):
        return env[a] if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, value)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, value)
    if node.target in _VIEWS and isinstance(args[0], torch.Tensor):
        try:
            return node.target(*args, **kwargs)
        except RuntimeError:
            source = node.args[0]
            with gm.graph.inserting_before(node):
                copy = gm.graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
            inserted.append(copy)
            env[copy] = aten.clone.default(args[0], memory_format=torch.contiguous_format)
            node.update_arg(0, copy)
            return node.target(env[copy], *args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _attribute(gm: torch.fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _remove(gm: torch.fx.GraphModule, inserted: list[torch.fx.Node]) -> None:
    for copy in reversed(inserted):
        copy.replace_all_uses_with(copy.args[0])
        gm.graph.erase_node(copy)


def _visible_outputs(gm: torch.fx.GraphModule, kind: str) -> dict[int, torch.Tensor]:
    """Output positions whose strides the caller sees, with their traced values: all of them but
    what a forward saves for its backward."""
    values = gm.graph.find_nodes(op="output")[0].args[0]
    count = len(values)
    if kind == "forward":
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        if meta is not None:
            count = min(count, len(meta.tokens) + meta.num_forward)
    return {i: values[i].meta.get("val") for i in range(count) if isinstance(values[i], torch.fx.Node)}


def _restore_visible_outputs(gm: torch.fx.GraphModule, visible: dict[int, torch.Tensor]) -> None:
    output = gm.graph.find_nodes(op="output")[0]
    values = list(output.args[0])
    for i, traced in visible.items():
        node = values[i]
        now = node.meta.get("val")
        if not isinstance(traced, torch.Tensor) or not isinstance(now, torch.Tensor) or now.stride() == traced.stride():
            continue
        # A copy whose traced value has eager's strides: the lowering realizes outputs in those.
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(aten.clone.default, (node,))
        copy.meta = dict(node.meta, val=traced)
        values[i] = copy
    output.args = (tuple(values),) + tuple(output.args[1:])


def _is_4d(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 4 and val.layout == torch.strided


def _static(val) -> bool:
    if not isinstance(val, torch.Tensor):
        return not isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))
    return all(isinstance(s, int) for s in (*val.shape, *val.stride(), val.storage_offset()))
