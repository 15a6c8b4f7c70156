"""Prints a Scatter member: its value stored, or atomically combined, at a computed position."""
from __future__ import annotations

from ..ir import use_handler
from ..ir.scatter import SCATTER_MODES
from .triton_ops import register_dtype, triton_type


def emit_scatter(kernel, node) -> None:
    """`out[position] (mode)= value` for each lane of the kernel; lanes past xnumel do nothing."""
    from .triton import TritonOps, _is_literal

    value = kernel.compute(node)
    placement = kernel.plan.placement[node.name]
    index, _ = node.kernel_index(placement, kernel.plan.xnumel, kernel.plan.rnumel)
    kernel.current.append(node)
    try:
        with use_handler(TritonOps(kernel)):
            position = node.data.output_index(index)
    finally:
        kernel.current.pop()
    offset = kernel.simplify(node.buffer.layout.index(position))
    shape = kernel.block_shape(1)

    dtype = node.buffer.get_dtype()
    text = value.name
    if value.rank == 0 and _is_literal(text):
        text = f"tl.full({shape}, {text}, {triton_type(register_dtype(value.dtype))})"
    elif value.rank < 1:
        text = f"tl.broadcast_to({text}, {shape})"
    if register_dtype(value.dtype) != dtype:
        text = f"{text}.to({triton_type(dtype)})"

    offset_text = kernel.index_text(offset)
    if kernel.rank_of(offset) < 1:
        offset_text = f"tl.broadcast_to({offset_text}, {shape})" if offset_text != "0" else \
            f"tl.full({shape}, 0, tl.int32)"
    ptr = kernel.args.output(node.write_name)
    mask = kernel.mask_for(1)
    call = SCATTER_MODES[node.data.mode]
    # Atomics need no ordering with other memory operations: relaxed is enough, and cheapest.
    extra = ", sem=\"relaxed\"" if node.data.mode is not None else ""
    if mask:
        extra = f", {mask}" + extra
    kernel.body.writeline(f"{call}({ptr} + ({offset_text}), {text}{extra})")
