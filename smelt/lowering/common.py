"""Helpers every lowering family uses: broadcasting loaders and building Pointwise nodes."""
from __future__ import annotations

from typing import Callable, Sequence

import sympy
import torch
import torch.fx

from ..ir import FixedLayout, Pointwise, TensorBox, ops
from ..symbolic import Expr, dense_dim_order, sympify


def is_tensor(x) -> bool:
    return isinstance(x, TensorBox)


def low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def upcast_half(dtype: torch.dtype) -> torch.dtype:
    """The type eager computes a float op in: float32 for half floats, any other type itself."""
    return torch.float32 if low_precision(dtype) else dtype


def in_dtype(value, dtype: torch.dtype):
    """A Python number operand as an ATen kernel computing in a half float reads it: rounded to
    that dtype (inf past its range). On the CPU, TensorIterator converts every input to the op's
    common dtype before the kernel, a wrapped number too, so x_fp16 + 0.1 adds 0.0999755859375,
    x_fp16 == 0.1 holds for that value and clamp_min(x_fp16, 1e-12) is max(x, 0) (checked in
    eager); mul and div read the number unconverted (original_scalar_value), as do ops taking a
    Scalar argument (slope, eps, alpha on CUDA): those lowerings keep `value`. On CUDA each kernel
    reads it as its own type; measured against the CPU on the H100 (torch 2.11): add, sub and rsub
    keep it in float32 (CPU only, below), the comparisons, remainder, fmod and pow convert it as
    on the CPU. The arithmetic stays float32."""
    if low_precision(dtype) and isinstance(value, (int, float, sympy.Number)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=dtype).item()
    return value


def scalar_operand_dtypes(graph, a, b) -> list[torch.dtype] | None:
    """Compute dtypes for mul's and div's operands where ATen's kernel reads the second one, a
    0-d float tensor wider than the half float it computes in, unconverted (its reduced-float
    scalar path: original_scalar_value), in float32: x_fp16 * torch.tensor(0.1) multiplies by
    0.1, not by 0.0999755859375 (checked in eager, on the CPU and on the H100, where the 0-d tensor
    is a CPU scalar; a first operand is converted). None otherwise."""
    out = graph.out_meta.dtype
    if (low_precision(out) and is_tensor(a) and is_tensor(b)
            and len(b.get_size()) == 0 and b.get_dtype() in (torch.float32, torch.float64)):
        return [out, torch.float32]
    return None


def broadcast_loader(x: TensorBox, size: Sequence[Expr]) -> Callable:
    """A loader over `size` that reads x broadcast to it (numpy rules, aligned from the right)."""
    inner = x.make_loader()
    xsize = x.get_size()
    lead = len(size) - len(xsize)
    assert lead >= 0, (xsize, size)

    def load(index):
        index = list(index)[lead:]
        return inner([sympy.Integer(0) if s == 1 and t != 1 else i for i, s, t in zip(index, xsize, size[lead:])])
    return load


def refusing_negative(position, size, dtype: torch.dtype):
    """ops.indirect_indexing for the ops whose eager kernels refuse a negative index (embedding,
    index_select, gather, scatter, index_reduce; `dtype`: the index tensor's), where `x[i]` counts it
    from the end: a negative one becomes `size`, which the bounds check refuses."""
    return ops.indirect_indexing(
        ops.where(ops.lt(position, ops.constant(0, dtype)), ops.index_expr(size, dtype), position), size)


def scalar_value(value, dtype: torch.dtype):
    """A handler value for a Python or symbolic scalar, in `dtype`."""
    if isinstance(value, sympy.Expr):
        if value.is_Integer:
            return ops.constant(int(value), dtype)
        if value.is_Float:
            return ops.constant(float(value), dtype)
        return ops.to_dtype(ops.index_expr(value, torch.int64), dtype)
    return ops.constant(value, dtype)


def out_size(graph) -> list[Expr]:
    return [sympify(s) for s in graph.out_meta.shape]


def device_of(graph, args) -> torch.device:
    meta = graph.out_meta
    if isinstance(meta, torch.Tensor):  # eager's: a CPU scalar operand of a CUDA op does not decide it
        return meta.device
    for a in args:
        if is_tensor(a):
            return a.get_device()
    return graph.out_meta.device


def make_pointwise(graph, args: Sequence, fn: Callable, compute_dtype: torch.dtype | None = None,
                   out_dtype: torch.dtype | None = None, size: Sequence[Expr] | None = None) -> TensorBox:
    """Elementwise `fn` over `args` (TensorBoxes or scalars), broadcast to the op's output shape.

    Inputs are cast to `compute_dtype` (default: the output dtype eager produces; a list gives
    one dtype per argument) before `fn`, and the result to `out_dtype` (default: eager's).
    """
    meta = graph.out_meta
    out_dtype = out_dtype or meta.dtype
    compute_dtype = compute_dtype or out_dtype
    arg_dtypes = list(compute_dtype) if isinstance(compute_dtype, (list, tuple)) else [compute_dtype] * len(args)
    size = list(size) if size is not None else out_size(graph)
    loaders = [broadcast_loader(a, size) if is_tensor(a) else None for a in args]

    def inner_fn(index):
        values = []
        for a, load, dtype in zip(args, loaders, arg_dtypes):
            if load is None:
                values.append(scalar_value(a, dtype))
            else:
                v = load(index)
                values.append(v if a.get_dtype() == dtype else ops.to_dtype(v, dtype))
        # A cast to the dtype a value already has is dropped by the code generator.
        return ops.to_dtype(fn(*values), out_dtype)

    origins = graph.origin.union(*[a.origins for a in args if is_tensor(a)])
    return TensorBox.of_storage(Pointwise(device_of(graph, args), out_dtype, inner_fn, size, origins))


def common_dtype(*args) -> torch.dtype:
    """Eager's type promotion among tensor and scalar arguments."""
    import torch._prims_common as utils
    probes = []
    for a in args:
        if is_tensor(a):
            probes.append(torch.empty((1,) * len(a.get_size()) if a.get_size() else (), dtype=a.get_dtype(),
                                      device="meta"))
        elif isinstance(a, sympy.Expr):
            probes.append(1 if a.is_integer else 1.0)
        elif a is not None:
            probes.append(a)
    _, result = utils.elementwise_dtypes(*probes,
                                         type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return result


def is_dense(meta: torch.Tensor) -> bool:
    """Whether eager's strides pack the elements with no gaps or overlaps; symbolic ones do not count."""
    if any(isinstance(v, torch.SymInt) for v in (*meta.stride(), *meta.size())):
        return False
    return dense_dim_order(list(meta.size()), list(meta.stride())) is not None


def traced_value(node):
    """The value an FX node had when the graph was traced (its meta "val"); None for a non-node."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def layout_of(val: torch.Tensor, cls=FixedLayout):
    """The layout of a real tensor as a kernel sees it: offsets count from its data pointer, which
    already includes the storage offset."""
    return cls(val.device, val.dtype, tuple(sympify(s) for s in val.shape),
               tuple(sympify(s) for s in val.stride()))
