"""Whether a value of a Dynamo graph is written in place later in the graph, through itself or a view.

The passes that run on the Dynamo graph before AOTAutograd (handwritten_attention.py,
attention_masks.py) change which SDPA kernel a call traces to; the fused kernels save their output
for the backward, so a program that writes that output in place (valid under eager's math path,
which saves no output) would fail AOTAutograd's trace: "one of the variables needed for gradient
computation has been modified by an inplace operation". Those passes leave such a call alone.
"""
from __future__ import annotations

import operator

import torch.fx

# Methods and functions whose result may share the first argument's memory.
_VIEWS = {
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "select", "narrow",
    "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten", "split", "split_with_sizes",
    "chunk", "unbind", "tensor_split", "movedim", "moveaxis", "swapaxes", "swapdims", "diagonal",
    "as_strided", "detach", "contiguous", "unfold", "real", "imag", "view_as_real", "view_as_complex",
    "getitem", "__getitem__", "type_as", "to", "float", "half", "bfloat16", "double", "type",
}
_AUGMENTED = {operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
              operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
              operator.ilshift, operator.irshift}


def _name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return node.target
    if node.op == "call_function":
        return getattr(node.target, "__name__", "")
    return ""


def _writes_first_argument(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target in _AUGMENTED:
        return True
    name = _name(node)
    if name.endswith("_") and not name.startswith("__"):  # clamp_, add_, masked_fill_, relu_ ...
        return True
    return name == "__setitem__" or node.kwargs.get("inplace") is True


def written_in_place(node: torch.fx.Node) -> bool:
    """Whether `node`'s value, or a view of it, is the first argument of an in-place op or the
    `out=` of a call."""
    seen, todo = set(), [node]
    while todo:
        value = todo.pop()
        for user in value.users:
            if user.kwargs.get("out") is value:
                return True
            if user.args and user.args[0] is value and _writes_first_argument(user):
                return True
            if user not in seen and _name(user) in _VIEWS and user.args and user.args[0] is value:
                seen.add(user)
                todo.append(user)
    return False
