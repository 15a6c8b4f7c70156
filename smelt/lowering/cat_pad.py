"""cat and constant_pad_nd: outputs assembled from pieces of inputs with masked loads."""
from __future__ import annotations

import sympy
import torch

from ..ir import FixedLayout, Pointwise, StorageBox, TensorBox, ops
from ..symbolic import contiguous_strides, product, sympify
from .common import is_dense, out_size
from .registry import lowering

aten = torch.ops.aten

# Up to this many pieces, a cat is a loop nest its readers inline (a where per piece); beyond, each
# piece is written into its slice of the output: a chain of hundreds of wheres costs every element
# a comparison per piece, and the kernel an argument per piece (clip_grad_norm_ stacks one norm
# per parameter).
CAT_INLINE_PIECES = 8


@lowering(aten.cat)
def cat(g, tensors, dim=0):
    meta = g.out_meta
    size = out_size(g)
    dim = dim + len(size) if dim < 0 else dim
    # Legacy rule: 1-D empty tensors are skipped whatever the other shapes. A piece empty along
    # `dim` adds nothing either, and kept, its load (which need not depend on the position along
    # `dim`) ran in a reduction's padding lanes past the last piece's start: a read of no memory
    # (a segfault in Triton's interpreter, found by the fuzzer). Sizes 0 are never symbolic.
    pieces = [t for t in tensors if not (len(t.get_size()) == 1 and t.get_size()[0] == 0)
              and t.get_size()[dim] != 0]
    if not pieces:  # every piece skipped: the result is as empty as they are
        return TensorBox.of_storage(Pointwise(meta.device, meta.dtype, lambda index: ops.constant(0, meta.dtype),
                                              size, g.origin))
    if len(pieces) == 1:  # a new tensor, as eager's: the piece itself made the result its alias
        return _cast(g, pieces[0], meta.dtype)
    starts, offset = [], sympy.Integer(0)
    for t in pieces:
        starts.append(offset)
        offset = offset + sympify(t.get_size()[dim])
    if len(pieces) > CAT_INLINE_PIECES and product(size) != 0:  # an empty cat has no slice to allocate it
        return _cat_into_slices(g, pieces, starts, dim, size)
    loaders = [t.make_loader() for t in pieces]
    dtype = meta.dtype

    def inner_fn(index):
        position = ops.index_expr(index[dim], torch.int64)
        result = None
        # Each piece is read only where the output index falls inside it, so no load strays
        # outside its input; the pieces are then chained with where.
        for k, (t, start, load) in enumerate(zip(pieces, starts, loaders)):
            shifted = list(index)
            shifted[dim] = index[dim] - start
            end = start + sympify(t.get_size()[dim])
            inside = None
            if k > 0:
                inside = ops.ge(position, ops.index_expr(start, torch.int64))
            if k < len(pieces) - 1:
                below = ops.lt(position, ops.index_expr(end, torch.int64))
                inside = below if inside is None else ops.logical_and(inside, below)

            def body(load=load, shifted=shifted, t=t):
                v = load(shifted)
                return v if t.get_dtype() == dtype else ops.to_dtype(v, dtype)
            value = ops.masked(inside, body, 0)
            result = value if result is None else ops.where(inside, value, result)
        return result
    origins = g.origin.union(*[t.origins for t in pieces])
    return TensorBox.of_storage(Pointwise(meta.device, dtype, inner_fn, size, origins))


def _cat_into_slices(g, pieces, starts, dim, size):
    """The cat as memory each piece writes its slice of; a piece's loop nest fuses into whatever
    kernel computes its values."""
    meta, dtype = g.out_meta, g.out_meta.dtype
    stride = [sympify(s) for s in meta.stride()] if is_dense(meta) else contiguous_strides(size)
    storage = g.register_shared_storage(FixedLayout(meta.device, dtype, tuple(size), tuple(stride)))
    for t, start in zip(pieces, starts):
        if t.get_numel() == 0:
            continue
        load = t.make_loader()

        def copy(index, load=load, t=t):
            v = load(index)
            return v if t.get_dtype() == dtype else ops.to_dtype(v, dtype)
        loops = Pointwise(meta.device, dtype, copy, t.get_size(), g.origin | t.origins)
        piece = g.register_computed(loops, layout=FixedLayout(meta.device, dtype, tuple(t.get_size()), tuple(stride)))
        piece.lives_in = (storage.name, start * stride[dim])
    return TensorBox(StorageBox(storage))


def _cast(g, x, dtype):
    """`x` as a new tensor of `dtype` (a loop nest: it fuses into its readers)."""
    load = x.make_loader()
    value = load if x.get_dtype() == dtype else (lambda idx: ops.to_dtype(load(idx), dtype))
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, value, x.get_size(), g.origin | x.origins))


@lowering(aten.constant_pad_nd)
def constant_pad_nd(g, x, pad, value=0):
    size = out_size(g)
    old = x.get_size()
    ndim = len(size)
    # pad lists (before, after) pairs starting from the last dimension.
    befores, afters = [sympy.Integer(0)] * ndim, [sympy.Integer(0)] * ndim
    for k in range(len(pad) // 2):
        befores[ndim - 1 - k], afters[ndim - 1 - k] = sympify(pad[2 * k]), sympify(pad[2 * k + 1])
    load = x.make_loader()
    dtype = g.out_meta.dtype

    def inner_fn(index):
        source = [i - b for i, b in zip(index, befores)]
        conditions = []
        for d, (s, b) in enumerate(zip(source, befores)):
            # A side padded by nothing (or cropped) needs no check: Swin pads its windows by zero
            # rows, and each check was an int64 compare per element of its layer norms.
            if not _at_most_zero(b):
                conditions.append(ops.ge(ops.index_expr(s, torch.int64), ops.constant(0, torch.int64)))
            if not _at_most_zero(afters[d]):
                conditions.append(ops.lt(ops.index_expr(s, torch.int64), ops.index_expr(old[d], torch.int64)))
        if not conditions:
            return load(source)
        inside = conditions[0]
        for c in conditions[1:]:
            inside = ops.logical_and(inside, c)
        return ops.masked(inside, lambda: load(source), value)
    return TensorBox.of_storage(Pointwise(g.out_meta.device, dtype, inner_fn, size, g.origin | x.origins))


def _at_most_zero(amount) -> bool:
    """Whether a pad amount is surely no padding (zero, or a crop)."""
    return bool(amount.is_number and amount <= 0)
