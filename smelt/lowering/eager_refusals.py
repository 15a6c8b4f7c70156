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


def refuse_numbers_as_eager(gm: torch.fx.GraphModule) -> None:
    """Raise eager's error where an op of a Dynamo graph (the program's own calls, before any
    decomposition) has a number past the range of its tensors' dtype that eager refuses to convert:
    `x.masked_fill(m, 70000.)` or `x.add(y, alpha=70000.)` on a float16 x, `x.add(y, alpha=1000)` on
    an int8 one, a float32 `torch.where(c, x, 1e39)`. Meta kernels and torch's decompositions skip
    eager's check, and smelt computed inf or wrapped values. After decomposition the ops are no longer
    told apart (a float16 where(c, x, 70000.), which eager accepts, is a masked_fill's ATen graph; a
    float32 one, refused, is a nan_to_num(posinf=1e39)'s, accepted). Only a node with such a number
    runs, once, in eager on stand-ins of its tensors; only eager's overflow error counts. Nodes with
    sizes past SIZE_LIMIT or without a tensor are left to refuse_as_eager (a factory's sizes)."""
    for node in gm.graph.nodes:
        # Every compile walks this: a node without a number past the smallest range reads nothing more.
        if node.op not in ("call_function", "call_method") or not any(
                _past(a, _SMALLEST_RANGE) for a in (*node.args, *node.kwargs.values())):
            continue
        args, kwargs = _values(node)
        ranges = list(_dtype_ranges(args, kwargs))
        if not ranges or _sizes_past_limit(args, kwargs):
            continue
        if not any(_past(a, min(ranges)) for a in (*args, *kwargs.values())):
            continue
        if node.op == "call_method":
            call = lambda self, *rest, **kw: getattr(self, node.target)(*rest, **kw)  # noqa: E731
        else:
            call = node.target
        _raise_if_eager_overflows(call, args, kwargs, f" in {node.format_node()}")


_SMALLEST_RANGE = 127  # int8's largest value, the least of any dtype with a range (_largest)
SIZE_LIMIT = 64  # an int in a list argument past this may be a size: its stand-in run could be large


def _sizes_past_limit(args, kwargs) -> bool:
    return any(isinstance(a, (list, tuple)) and any(type(x) is int and abs(x) > SIZE_LIMIT for x in a)
               for a in (*args, *kwargs.values()))


def _dtype_ranges(args, kwargs):
    """The largest finite value of each float or integer tensor's dtype among the arguments."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and (largest := _largest(t.dtype)) is not None:
                yield largest


def _largest(dtype: torch.dtype) -> float | None:
    """dtype's largest finite value; None for bool, complex and the bit and sub-byte types."""
    if dtype.is_complex or dtype is torch.bool:
        return None
    try:
        return float((torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)).max)
    except (TypeError, RuntimeError, NotImplementedError):  # bits8, float4_e2m1fn_x2: no range to read
        return None


def _past(value, largest: float) -> bool:
    """Whether value is a finite number of magnitude past `largest` (c10's overflow check)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and abs(float(value)) > largest
    except OverflowError:  # an int past float64's range
        return True


def _raise_if_eager_overflows(call, args, kwargs, where: str) -> None:
    """Run call in eager on stand-ins of args' tensors and raise its overflow refusal, if it makes one.
    Any other error is the stand-ins' own (`x[70000]` of a two-element stand-in), arguments with a
    symbol are left alone (eager would guard on it), and the random generators' states are kept (a
    `randint_like(x, 70000)` would draw from them)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    def stand_in(a):
        if isinstance(a, (list, tuple)):
            return type(a)(stand_in(x) for x in a)
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _Symbolic
        return _tensor_stand_in(a) if isinstance(a, torch.Tensor) else a
    gpus = sorted({t.device.index or 0 for a in (*args, *kwargs.values())
                   for t in (a if isinstance(a, (list, tuple)) else (a,))
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    try:
        with unset_fake_temporarily(), disable_proxy_modes_tracing(), torch.random.fork_rng(devices=gpus):
            call(*stand_in(args), **{k: stand_in(v) for k, v in kwargs.items()})
    except Exception as error:  # noqa: BLE001 (see above: only the overflow refusal counts)
        if isinstance(error, RuntimeError) and "without overflow" in str(error):
            raise RuntimeError(f"{error} (eager refuses it{where})") from None


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
    # eager does not check (the program's own ops were checked before decomposing, refuse_numbers_as_eager).
    past = _past_float32(node) and node.target is not aten.scalar_tensor.default
    checked = (torch.float64,) if past else (torch.float32, torch.float64)
    return any(t.dtype not in checked or any(_small(s) == 0 for s in t.shape) for t in tensors)


def _values(node: torch.fx.Node) -> tuple[list, dict]:
    """node's arguments with each node replaced by its traced value."""
    def value(a):
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        if isinstance(a, torch.fx.Node):
            return a.meta.get("val", a.meta.get("example_value"))
        return a
    return [value(a) for a in node.args], {k: value(v) for k, v in node.kwargs.items()}


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
