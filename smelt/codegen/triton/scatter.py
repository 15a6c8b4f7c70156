"""Prints a Scatter member: its value stored, or atomically combined, at a computed position."""
from __future__ import annotations

import torch

from ...ir.scatter import SCATTER_MODES
from ..common import register_dtype
from .handler import _is_literal
from .ops import triton_type


def emit_scatter(kernel, node) -> None:
    """`out[position] (mode)= value` for each lane of the kernel; lanes past xnumel do nothing."""
    value = kernel.compute(node)
    offset = kernel.scatter_offset(node)
    shape = kernel.block_shape(1)

    dtype = node.buffer.get_dtype()
    text = value.name
    if value.rank == 0 and _is_literal(text):
        text = f"tl.full({shape}, {text}, {triton_type(register_dtype(value.dtype))})"
    elif value.rank < 1:
        text = f"tl.broadcast_to({text}, {shape})"
    if register_dtype(value.dtype) != dtype:
        text = f"{text}.to({triton_type(dtype)})"

    offset_text = kernel.index_block(offset, 1)
    ptr = kernel.args.output(node.write_name)
    mask = kernel.mask_for(1)
    if node.data.mode == "atomic_mul":
        _emit_multiply_loop(kernel, ptr, offset_text, text, dtype, mask)
        return
    call = SCATTER_MODES[node.data.mode]
    # Atomics need no ordering with other memory operations: relaxed is enough, and cheapest.
    extra = ", sem=\"relaxed\"" if node.data.mode is not None else ""
    if mask:
        extra = f", {mask}" + extra
    kernel.body.writeline(f"{call}({ptr} + ({offset_text}), {text}{extra})")


# The integer type whose bits a compare-and-swap compares, per element type.
_CAS_BITS = {torch.float32: "tl.int32", torch.float64: "tl.int64", torch.int32: "tl.int32", torch.int64: "tl.int64"}


def _emit_multiply_loop(kernel, ptr: str, offset: str, value: str, dtype, mask: str | None) -> None:
    """out[offset] *= value as a compare-and-swap loop, comparing bits (a NaN never equals itself).

    Each pass every pending lane tries to swap in seen * value; a lane whose swap fails (another
    lane or program wrote first) retries with what it found. Lanes done or masked off swap a value
    for itself, which never changes memory; masked lanes aim at element 0 to stay in bounds."""
    n = kernel.cse.counter
    kernel.cse.counter += 1
    bits, element = _CAS_BITS[dtype], triton_type(dtype)
    where = f"tl.where({mask}, {offset}, 0)" if mask else offset
    body = kernel.body
    body.writeline(f"cas_ptr{n} = ({ptr} + {where}).to(tl.pointer_type({bits}))")
    body.writeline(f"seen{n} = tl.load({ptr} + {where}{', ' + mask if mask else ''})")
    body.writeline(f"pending{n} = {mask or 'tl.full(' + kernel.block_shape(1) + ', 1, tl.int1)'}")
    # tl.reduce with Triton's own combine: the interpreter runs it natively (tl.sum would not load there);
    # over every dim (None), so that the loop condition is a scalar whatever the block's rank.
    body.writeline(f"while tl.reduce(pending{n}.to(tl.int32), None, tl.standard._sum_combine) > 0:")
    with body.indent():
        body.writeline(f"expected{n} = seen{n}.to({bits}, bitcast=True)")
        body.writeline(f"wanted{n} = tl.where(pending{n}, seen{n} * {value}, seen{n}).to({bits}, bitcast=True)")
        body.writeline(f"found{n} = tl.atomic_cas(cas_ptr{n}, expected{n}, wanted{n}, sem=\"relaxed\")")
        body.writeline(f"pending{n} = pending{n} & (found{n} != expected{n})")
        body.writeline(f"seen{n} = found{n}.to({element}, bitcast=True)")
