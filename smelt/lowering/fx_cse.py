"""Identical ATen calls on identical inputs merged before lowering (common subexpressions).

Models repeat work that eager repeats too: Hugging Face's BERT converts its attention mask once per
layer (at real size, 61 of the graph's nodes repeat one another: 11 `where(mask, 0, -inf)` chains).
The scheduler fused all twelve conversions into the first kernel, since they share an input, so
twelve [B, 1, S, S] masks were written at once and stayed alive until their layer (48 MiB on the
H100 in bf16). Merged, there is one.

Left alone: ops that draw random numbers (each call must draw anew), ops that write their inputs,
uninitialized allocations, values with unbacked sizes (a merged `.item()` would leave its users'
sizes naming a symbol no node defines), and any value the caller can see, directly or through a
view: eager returns two tensors there, and merging would make them share memory. Two calls merge
only where no write lies between them: a read after a write sees other values.

It also runs on AOTAutograd's joint graph before the partitioner (backend.py), in place of
AOTAutograd's own pass, whose first use imports most of Inductor (0.9 s of a warm start).
"""
from __future__ import annotations

import operator

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols


def merge_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merges repeated pure calls in place; returns how many nodes went."""
    exposed = _seen_by_caller(gm.graph)
    first: dict = {}
    merged = 0
    writes = 0  # mutating calls so far: calls merge only within one stretch between writes
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if _writes(node.target):
            writes += 1
            continue
        if node in exposed or not _pure(node.target) or _unbacked(node):
            continue
        key = (writes, node.target, _key(node.args), _key(node.kwargs))
        try:
            hash(key)
        except TypeError:  # an argument with no value identity
            continue
        kept = first.setdefault(key, node)
        if kept is node:
            continue
        node.replace_all_uses_with(kept)  # later nodes now name `kept`, so their keys meet too
        gm.graph.erase_node(node)
        merged += 1
    if merged:
        gm.recompile()
    return merged


def _key(value):
    """A hashable stand-in for an argument: nodes by identity, scalars with their type (1, 1.0 and
    True compare equal in Python, but not as an op's argument: the result's dtype differs)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key(v)) for k, v in value.items())))
    if isinstance(value, torch.fx.Node):
        return value
    if isinstance(value, float):  # by its bits: 0.0 == -0.0 in Python, and nan != nan
        return ("float", value.hex())
    if isinstance(value, complex):
        return ("complex", value.real.hex(), value.imag.hex())
    return (type(value).__name__, value)


def _pure(target) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False  # higher-order ops, Python functions: left as they are
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    return "empty" not in target._opname  # uninitialized memory: two are two buffers


def _unbacked(node: torch.fx.Node) -> bool:
    """Whether its value has a size (or is a number) no example fixes; a value of a kind torch
    cannot read sizes from counts as one (left alone)."""
    try:
        return bool(free_unbacked_symbols(node.meta.get("val")))
    except AssertionError:
        return True


def _writes(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    return isinstance(target, torch._ops.HigherOrderOperator)  # what one writes is not in a schema: assume it does


def _aliases_input(target) -> bool:
    if target is operator.getitem:
        return True
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _seen_by_caller(graph: torch.fx.Graph) -> set:
    """The graph's outputs and every value an output is a view of."""
    exposed: set = set()
    pending: list = []
    torch.fx.node.map_arg(graph.output_node().args, pending.append)
    while pending:
        node = pending.pop()
        if node in exposed:
            continue
        exposed.add(node)
        if node.op == "call_function" and _aliases_input(node.target):
            torch.fx.node.map_arg((node.args, node.kwargs), pending.append)
    return exposed
