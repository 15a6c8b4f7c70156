"""Whether a value of a Dynamo graph is written in place later in the graph, through itself or a view.

The passes that run on the Dynamo graph before AOTAutograd (handwritten_attention.py,
attention_masks.py) change which SDPA kernel a call traces to, and read a chain's operands where its
last op runs (memory_writers: an operand written between its read and that point would be read
changed); the fused kernels save their output
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
    return bool(_writers(node, first_only=True))


def _writers(node: torch.fx.Node, first_only: bool = False) -> list[torch.fx.Node]:
    """The calls writing `node`'s value, or a view of it, in place."""
    seen, todo, found = set(), [node], []
    while todo:
        value = todo.pop()
        for user in value.users:
            if user.kwargs.get("out") is value or (user.args and user.args[0] is value and _writes_first_argument(user)):
                found.append(user)
                if first_only:
                    return found
            if user not in seen and _name(user) in _VIEWS and user.args and user.args[0] is value:
                seen.add(user)
                todo.append(user)
    return found


def memory_writers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The calls writing in place the memory `node`'s value lies in: through the value, the tensor
    it is a view of, or any other view of that."""
    base = node
    while _name(base) in _VIEWS and base.args and isinstance(base.args[0], torch.fx.Node):
        base = base.args[0]
    return _writers(base)
