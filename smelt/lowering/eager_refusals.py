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
import threading

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
# Ops whose number past a float range eager may or may not refuse, depending on the op a
# decomposition made them of: a float32 scalar_tensor or where of 1e39 comes from where(c, x, 1e39)
# (refused) and from nan_to_num(x, posinf=1e39) (not). They are let through, inf as computed.
_AMBIGUOUS = {aten.scalar_tensor.default, aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther,
              aten.where.Scalar}
_SIZED = {aten.full.default: 0}  # ops whose size argument is a list, by its position
_PADS = {aten.constant_pad_nd.default: 1}  # a crop past a stand-in's elements would raise: pads only


def refuse_as_eager(gm: torch.fx.GraphModule) -> None:
    """Raise the error eager raises for the first node of `gm` it refuses, naming the node."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target not in CHECKED:
            # Any other op with a Scalar (an add's alpha), only beside a number past a tensor's
            # dtype's range: an ordinary call runs no stand-in.
            if (isinstance(node.target, torch._ops.OpOverload) and node.target not in _AMBIGUOUS
                    and _node_number_past_range(node)):
                _raise_if_eager_overflows(node.target, *_values(node), f" in node {node.name}: {node.format_node()}")
            continue
        if not _may_refuse(node):
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


def refusing_numbers_eager_refuses(op, decomposition):
    """op's decomposition, first raising eager's error where eager refuses a number argument past the
    range of a tensor's dtype (`x.masked_fill(m, 70000.)` or `x.add(y, alpha=70000.)` on a float16 x,
    `x.add(y, alpha=1000)` on an int8 one): eager converts an op's Scalar arguments to its compute type with a range check, its
    meta kernels and torch's decompositions do not, and smelt computed inf. The parts lose which op
    they came from (a float16 `torch.where(c, x, 70000.)`, which eager lets through, decomposes as
    masked_fill does), so the check runs on the op itself: only when such a number is present, on
    stand-ins of its tensors as refuse_as_eager runs, and only eager's overflow refusal counts."""
    scalars = _scalar_arguments(op)

    def run(*args, **kwargs):
        # Only an op of the traced program: one a decomposition calls takes the decomposition's own
        # numbers (nan_to_num's posinf, which eager does not check, reaches a where.ScalarSelf).
        if _decomposing.depth == 0 and scalars and _has_number_past_range(scalars, args, kwargs):
            _raise_if_eager_overflows(op, args, kwargs)
        _decomposing.depth += 1
        try:
            return decomposition(*args, **kwargs)
        finally:
            _decomposing.depth -= 1
    return run


class _Depth(threading.local):
    depth = 0


_decomposing = _Depth()


def _scalar_arguments(op) -> list[tuple[int, str]]:
    """(position, name) of op's Scalar and Scalar? arguments."""
    return [(k, a.name) for k, a in enumerate(op._schema.arguments) if str(a.type) in ("number", "Optional[number]")]


def _has_number_past_range(scalars, args, kwargs) -> bool:
    numbers = [args[k] if k < len(args) else kwargs.get(name) for k, name in scalars]
    largest = min(_dtype_ranges(args, kwargs), default=None)
    return largest is not None and any(_past(v, largest) for v in numbers)


def _dtype_ranges(args, kwargs):
    """The largest finite value of each float or integer tensor's dtype among the arguments."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                yield torch.finfo(t.dtype).max
            elif isinstance(t, torch.Tensor) and not t.dtype.is_complex and t.dtype is not torch.bool:
                yield torch.iinfo(t.dtype).max


def _past(value, largest: float) -> bool:
    """Whether value is a finite number of magnitude past `largest` (c10's overflow check)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and abs(float(value)) > largest
    except OverflowError:  # an int past float64's range
        return True


def _raise_if_eager_overflows(op, args, kwargs, where: str = " with these arguments") -> None:
    """Run op in eager on stand-ins of args' tensors and raise its overflow refusal, if it makes one;
    arguments with a symbol are left alone (eager would guard on it)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    def stand_in(a):
        if isinstance(a, (list, tuple)):
            return type(a)(stand_in(x) for x in a)
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _Symbolic
        return _tensor_stand_in(a) if isinstance(a, torch.Tensor) else a
    try:
        with unset_fake_temporarily(), disable_proxy_modes_tracing():
            op(*stand_in(args), **{k: stand_in(v) for k, v in kwargs.items()})
    except _Symbolic:
        return
    except RuntimeError as error:
        if "without overflow" in str(error):
            raise RuntimeError(f"{error} (eager refuses {op}{where})") from None


class _Symbolic(Exception):
    pass


def _tensor_stand_in(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros([_small(s) for s in t.shape], dtype=t.dtype, device=t.device)


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
    # A float32 scalar_tensor is left alone: nan_to_num's decomposition makes one of its posinf, which
    # eager does not check (a masked_fill's is checked before decomposing, refusing_numbers_eager_refuses).
    past = _past_float32(node) and node.target is not aten.scalar_tensor.default
    checked = (torch.float64,) if past else (torch.float32, torch.float64)
    return any(t.dtype not in checked or any(_small(s) == 0 for s in t.shape) for t in tensors)


def _values(node: torch.fx.Node) -> tuple[list, dict]:
    """node's arguments with each node replaced by its traced value."""
    def value(a):
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    return [value(a) for a in node.args], {k: value(v) for k, v in node.kwargs.items()}


def _node_number_past_range(node: torch.fx.Node) -> bool:
    scalars = _scalar_arguments(node.target)
    return bool(scalars) and _has_number_past_range(scalars, *_values(node))


def _past_float32(node: torch.fx.Node) -> bool:
    """Whether a number among node's arguments is finite and past float32's range (eager's
    `torch.full((2,), 1e39)` raises; a fill of it computed inf)."""
    return any(_past(a, torch.finfo(torch.float32).max) for a in (*node.args, *node.kwargs.values()))


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
                return _tensor_stand_in(val)
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
