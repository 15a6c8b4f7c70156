"""torch._foreach_* ops: one per-tensor op over each position of the lists.

An optimizer step written with foreach ops (`torch.optim.Adam(foreach=True)`) reaches smelt as a
few ops over lists of ~all parameters. Each position is lowered as the single-tensor op it
stands for (`_foreach_addcmul.Scalar(xs, ys, zs, v)[i]` is `addcmul(xs[i], ys[i], zs[i], value=v)`),
so every parameter's update fuses into one kernel like any other pointwise code, and the combo
pass then launches those kernels together. The per-tensor op is found from the foreach op's
schema: list arguments are indexed, the others passed to every position.
"""
from __future__ import annotations

import torch

from ..ir import TensorBox
from . import registry

aten = torch.ops.aten


# aten.maximum / minimum take no scalar; with one they are clamp_min / clamp_max.
_WITH_SCALAR = {"maximum": "clamp_min", "minimum": "clamp_max"}


def _single_overload(base: str, foreach_overload: str, per_position_args) -> torch._ops.OpOverload | None:
    """The overload of aten.<base> that position-wise arguments like these call."""
    if foreach_overload in ("Scalar", "ScalarList"):
        base = _WITH_SCALAR.get(base, base)
    packet = getattr(aten, base, None)
    if packet is None:
        return None
    names = {"List": ["Tensor"], "ScalarList": ["Scalar", "Tensor"], "Scalar": ["Scalar", "Tensor"],
             "Tensor": ["Tensor"], "default": ["default", "Tensor"],
             "ScalarAndTensor": ["Scalar"]}.get(foreach_overload, [foreach_overload])
    for name in names + ["default"]:
        op = getattr(packet, name, None)
        if op is None:
            continue
        schema_args = op._schema.arguments
        if len(schema_args) < len(per_position_args):
            continue
        if all(_fits(a, v) for a, v in zip(schema_args, per_position_args)):
            return op
    return None


def _fits(arg: torch._C.Argument, value) -> bool:
    return isinstance(arg.type, torch.TensorType) == isinstance(value, TensorBox)


def _lower_foreach(op: torch._ops.OpOverload):
    base = op._schema.name.split("::")[-1][len("_foreach_"):]
    overload = op._overloadname
    schema = op._schema.arguments

    def lower(graph, *args, **kwargs):
        # The call's arguments in schema order: the single-tensor op takes them in the same order
        # (its names differ: `scalar` is add's `other`, `tensors1` is lerp's `end`).
        given = list(args) + [kwargs.pop(a.name) for a in schema[len(args):] if a.name in kwargs]
        if kwargs or len(given) > len(schema):
            return NotImplemented  # an argument skipped before a given one: left to ATen
        listed = [isinstance(a.type, torch.ListType) for a in schema[:len(given)]]
        lists = [v for v, is_list in zip(given, listed) if is_list]
        if not lists or any(len(v) != len(lists[0]) for v in lists):
            return NotImplemented
        metas = graph.out_meta
        if not isinstance(metas, (list, tuple)) or len(metas) != len(lists[0]):
            return NotImplemented
        results = []
        for i in range(len(lists[0])):
            position = [v[i] if is_list else v for v, is_list in zip(given, listed)]
            single = _single_overload(base, overload, position)
            fn = registry.lookup(single) if single is not None else None
            if fn is None:
                return NotImplemented  # ATen runs the whole foreach op
            single_args = single._schema.arguments
            positional = [v for v, a in zip(position, single_args) if not a.kwarg_only]
            keywords = {a.name: v for v, a in zip(position, single_args) if a.kwarg_only}
            with graph.lowering_position(single, metas[i], positional, keywords):
                result = fn(graph, *positional, **keywords)
            if result is NotImplemented:
                return NotImplemented
            results.append(result)
        return results

    return lower


def _register() -> None:
    # Every registered op by name: `dir(torch.ops.aten)` lists only the ops loaded so far (torch 2.11).
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::_foreach_"):
            continue
        name, _, overload_name = qualified[len("aten::"):].partition(".")
        if name.endswith("_") or overload_name.startswith("out"):
            continue  # functional graphs carry the out-of-place forms only
        op = getattr(getattr(aten, name), overload_name or "default")
        registry.LOWERINGS[op] = _lower_foreach(op)


_register()
