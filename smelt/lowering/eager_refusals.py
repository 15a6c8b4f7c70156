"""Programs eager refuses with an error that the meta kernels Dynamo and AOTAutograd trace with let
through: a scalar that does not fit the tensor's integer type (`int8_tensor.clamp(max=1000)`,
`torch.where(c, int8_tensor, 1000)`), an integer to a negative power, argmax of bools, a max over an
empty dim. smelt would compute a value (1000 wrapped to -24); it raises eager's own error instead.

Eager's checks are quirky (127.9 does not fit int8 in `full`, -1 fits uint8), so rather than restate
them, each such op runs once in eager on stand-ins of its tensors: the same dtypes, rank and device
(eager's CUDA kernels divide integers by 0 without a check), two elements along each dim (one along a
dim of one, none along an empty one). An op with a symbolic scalar is left alone: running it would
guard on the symbol.
"""
from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

aten = torch.ops.aten

# Ops whose scalar or dim checks eager makes and their meta kernels skip (as they appear after
# smelt's decompositions: masked_fill and index_fill become a scalar_tensor and a where or index_put).
CHECKED = {
    aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.full.default, aten.full_like.default,
    aten.scalar_tensor.default, aten.fill.Scalar, aten.scatter.value, aten.pow.Tensor_Scalar,
    aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim, aten.amax.default, aten.amin.default,
    aten.max.default, aten.min.default, aten.constant_pad_nd.default,
    *(_BY_A_NUMBER := {aten.div.Tensor_mode, aten.remainder.Scalar, aten.fmod.Scalar, aten.floor_divide.default}),
}
_SIZED = {aten.full.default: 0}  # ops whose size argument is a list, by its position
_PADS = {aten.constant_pad_nd.default: 1}  # a crop past a stand-in's elements would raise: pads only


def refuse_as_eager(gm: torch.fx.GraphModule) -> None:
    """Raise the error eager raises for the first node of `gm` it refuses, naming the node."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in CHECKED or not _may_refuse(node):
            continue
        try:
            with unset_fake_temporarily():  # AOTAutograd calls its compilers under its fake mode
                stand_ins = _stand_ins(node)
        except (RuntimeError, AssertionError):  # a device this process cannot use (a GPU graph generated on the CPU)
            continue
        if stand_ins is None:
            continue
        try:
            with unset_fake_temporarily():
                node.target(*stand_ins[0], **stand_ins[1])
        except (RuntimeError, IndexError, ValueError, ZeroDivisionError) as error:
            message = f"{error} (eager refuses {node.target} in node {node.name}: {node.format_node()})"
            try:
                refusal = type(error)(message)
            except Exception:  # an error type that takes other arguments
                refusal = RuntimeError(message)
            raise refusal from None


def _may_refuse(node: torch.fx.Node) -> bool:
    """Only integer, bool and half-float values, float32 ones beside a number past float32's range,
    or empty dims meet eager's checks; a division only by a number (an integer one by 0 raises
    ZeroDivisionError), as a tensor's stand-in would be 0."""
    if node.target in _BY_A_NUMBER and not (len(node.args) > 1 and isinstance(node.args[1], (int, float))):
        return False
    values = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    tensors += [v for v in values if isinstance(v, (tuple, list)) for v in v if isinstance(v, torch.Tensor)]
    if not tensors:
        return False
    checked = (torch.float64,) if _past_float32(node) else (torch.float32, torch.float64)
    return any(t.dtype not in checked or any(_small(s) == 0 for s in t.shape) for t in tensors)


def _past_float32(node: torch.fx.Node) -> bool:
    """Whether a number among node's arguments is finite and past float32's range (eager's
    `torch.full((2,), 1e39)` raises; a fill of it computed inf)."""
    largest = torch.finfo(torch.float32).max
    for a in (*node.args, *node.kwargs.values()):
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            try:
                if math.isfinite(float(a)) and abs(float(a)) > largest:
                    return True
            except OverflowError:
                return True
    return False


def _stand_ins(node: torch.fx.Node):
    """(args, kwargs) to run node's op on, or None where an argument is symbolic."""
    symbolic = False

    def stand_in(a, size_list=False):
        nonlocal symbolic
        if isinstance(a, (list, tuple)):
            return [_small(s) if size_list else stand_in(s) for s in a]
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                return torch.zeros([_small(s) for s in val.shape], dtype=val.dtype, device=val.device)
            symbolic = True
            return None
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            symbolic = True
        return a
    args = [stand_in(a, size_list=node.target in _SIZED and k == _SIZED[node.target]) for k, a in enumerate(node.args)]
    if node.target in _PADS:
        at = _PADS[node.target]
        args[at] = [max(p, 0) for p in args[at]]
    kwargs = {k: stand_in(v) for k, v in node.kwargs.items()}
    kwargs.pop("pin_memory", None)
    return None if symbolic else (args, kwargs)


def _small(size) -> int:
    """0 for a dim known to be empty, 1 for one of size 1, else 2 (a symbolic size included, without a
    guard on it: Dynamo specializes sizes 0 and 1). Not 1 everywhere: eager's CPU fill of a
    one-element tensor skips the range check it makes on more (`full((2,), 70000.,
    dtype=float16)` raises, `full((1,), ...)` gives inf)."""
    if type(size) is int and size <= 1:
        return size
    return 2
