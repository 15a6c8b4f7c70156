"""Every value's traced metadata worked out again after a pass changed a graph's layouts.

A pass that gives some values new strides (lowering/layout_plan.py) inserts its copies into the FX
graph, then asks for every node's fake value to be computed again from the placeholders', in the
graph's own fake mode, as eager would compute them given the new layouts: the lowering realizes
values in their traced layouts, so the metadata must say what the kernels will produce.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx
from torch._guards import detect_fake_mode

from ..ir.extern import returns_new_memory

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

# View ops that fail on strides they cannot express: their input is made contiguous first.
_VIEWS = (aten.view.default, aten._unsafe_view.default)
# Ops that read (or write) their first input's storage, not its elements: new strides change
# which elements they reach. The positions of their size, stride and storage offset arguments.
_STORAGE_READERS = {aten.as_strided.default: (1, 2, 3), aten.as_strided_scatter.default: (2, 3, 4)}


class Checkpoint:
    """A graph's nodes and their arguments at one moment, to return to: whatever a pass then
    inserted is erased and every earlier node reads its old arguments again."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.nodes = list(gm.graph.nodes)
        self.arguments = {n: (n.args, n.kwargs) for n in self.nodes}
        self.values = {n: n.meta.get("val") for n in self.nodes}

    def changed(self, gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
        """The nodes a pass touched since: inserted, given other arguments, or given another value."""
        return {n for n in gm.graph.nodes if n not in self.arguments or n.args is not self.arguments[n][0]
                or n.kwargs is not self.arguments[n][1]
                or n.meta.get("val") is not self.values[n]}

    def inserted(self, gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
        known = set(self.nodes)
        return [n for n in gm.graph.nodes if n not in known]

    def restore(self, gm: torch.fx.GraphModule, values: bool = False) -> None:
        """Every node's arguments as they were, inserted nodes gone; with `values`, their traced
        values too (else a placeholder keeps the value a pass gave it, which its caller then handles)."""
        for node in self.nodes:
            node.args, node.kwargs = self.arguments[node]
            if values and self.values[node] is not None:
                node.meta["val"] = self.values[node]
        for node in reversed(self.inserted(gm)):  # later ones first: each is read only by later ones
            gm.graph.erase_node(node)


def retrace(gm: torch.fx.GraphModule, since: Checkpoint) -> bool:
    """Trace again (fake tensors, the graph's own fake mode) the layout of every value the changes
    since `since` (taken before the pass changed the graph) can reach, and keep the results; on
    failure leave the metadata alone, return the graph to `since` and return False. A view the new
    strides cannot express gets a contiguous copy of its input. Values no change reaches keep
    their traced metadata: a padded LM head at a graph's end re-traces a few nodes, not BERT's
    760 (0.42 s a trace at its real size)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if fake_mode is None:
        since.restore(gm)
        return False
    dirty = since.changed(gm)
    env: dict[torch.fx.Node, object] = {}
    try:
        with fake_mode:
            for node in list(gm.graph.nodes):
                if node.op == "placeholder":
                    env[node] = node.meta.get("val")
                elif node.op == "get_attr":  # a constant's fake value, or a subgraph module
                    env[node] = node.meta["val"] if "val" in node.meta else operator.attrgetter(node.target)(gm)
                elif node.op == "call_function":
                    if node not in dirty and node.meta.get("val") is not None \
                            and not any(a in dirty for a in node.all_input_nodes):
                        env[node] = node.meta["val"]
                        continue
                    dirty.add(node)
                    if node.target in _STORAGE_READERS:
                        _keep_storage_read(gm, node, env, since)
                    env[node] = _run(gm, node, env)
                    if node in since.arguments and _same_new_memory(node, node.meta.get("val"), env[node]):
                        # Its readers would trace what they traced before: they need not run again.
                        env[node] = node.meta["val"]
                        dirty.discard(node)
                elif node.op != "output":
                    raise NotImplementedError(f"FX node kind {node.op}")
    except Exception as e:  # an op without a fake kernel, a data-dependent size: plan nothing
        log.debug("smelt: layouts not re-traced (%s at %s: %s); the graph keeps its traced layouts",
                  type(e).__name__, getattr(node, "name", "?"), e)
        since.restore(gm)
        return False
    for node, val in env.items():
        if node.op == "call_function" and val is not None:
            node.meta["val"] = val
    return True


def _same_new_memory(node: torch.fx.Node, old, new) -> bool:
    """Whether `node` returns memory of its own (so no reader can tell its value from another by
    aliasing) and its new value is the old one's shape, dtype and layout, item by item."""
    if not (isinstance(node.target, torch._ops.OpOverload) and returns_new_memory(node.target)):
        return False
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return (old.shape, old.dtype, old.device, old.stride(), old.storage_offset()) == \
            (new.shape, new.dtype, new.device, new.stride(), new.storage_offset())
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) and len(old) == len(new):
        return all(_same_new_memory(node, a, b) if isinstance(a, torch.Tensor) else a is b or a == b
                   for a, b in zip(old, new))
    return False


def _keep_storage_read(gm, node: torch.fx.Node, env: dict, since: Checkpoint) -> None:
    """`node` (as_strided, as_strided_scatter) reaches into its input's storage: where a pass
    changed the layout of that input or of any value it views, it reads a contiguous copy instead,
    which holds what the traced storage held where the traced input was contiguous from its
    storage's start and the reach stays within its elements (fuzz seed 4303: a padded product's
    rows in place of the contiguous clone an as_strided read). Any other such change is refused
    (the graph keeps its traced layouts)."""
    source = node.args[0]
    before = since.arguments.get(node)
    traced_source = before[0][0] if before else None
    # The value before the pass: a placeholder's meta may already hold its new strides (restride_placeholders).
    traced = since.values.get(traced_source) if isinstance(traced_source, torch.fx.Node) else None
    new = env.get(source)
    if not isinstance(new, torch.Tensor) or not isinstance(traced, torch.Tensor):
        raise NotImplementedError(f"{node.name} reads the storage of a value whose traced layout is unknown")
    if traced_source is source and not any(_layout_changed(n, env, since) for n in _alias_chain(source)):
        return
    at_size, at_stride, at_offset = _STORAGE_READERS[node.target]
    size, stride = node.args[at_size], node.args[at_stride]
    offset = node.args[at_offset] if len(node.args) > at_offset and node.args[at_offset] is not None \
        else traced.storage_offset()
    reach = offset + sum((n - 1) * st for n, st in zip(size, stride)) if all(n > 0 for n in size) else -1
    if not (traced.is_contiguous() and traced.storage_offset() == 0 and reach < traced.numel()):
        raise NotImplementedError(f"{node.name} reads the storage of a value whose layout the plan changed")
    with gm.graph.inserting_before(node):
        copy = gm.graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
    env[copy] = aten.clone.default(new, memory_format=torch.contiguous_format)
    node.update_arg(0, copy)


def _alias_chain(node: torch.fx.Node) -> list[torch.fx.Node]:
    """`node` and the values it views, back to the one that owns the storage."""
    chain = [node]
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and node.target.is_view \
            and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
        chain.append(node)
    return chain


def _layout_changed(node, env: dict, since: Checkpoint) -> bool:
    """Whether `node`'s value has other strides or another storage offset than before the pass
    (or it is new, or either is unknown)."""
    old, new = since.values.get(node), env.get(node)
    if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor):
        return True
    return old.stride() != new.stride() or old.storage_offset() != new.storage_offset()


def _run(gm, node: torch.fx.Node, env: dict):
    def value(a):
        return env[a] if isinstance(a, torch.fx.Node) else a

    args = torch.fx.node.map_aggregate(node.args, value)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, value)
    if node.target in _VIEWS and isinstance(args[0], torch.Tensor):
        try:
            return node.target(*args, **kwargs)
        except (RuntimeError, ValueError):  # torch 2.11's fake view raises ValueError on CUDA
            source = node.args[0]
            with gm.graph.inserting_before(node):
                copy = gm.graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
            env[copy] = aten.clone.default(args[0], memory_format=torch.contiguous_format)
            node.update_arg(0, copy)
            return node.target(env[copy], *args[1:], **kwargs)
    return node.target(*args, **kwargs)

