"""Why an op runs as an ATen call although smelt has a lowering for it: no kernel of the backend
could compute it as eager does. Decided from the FX node's traced values, before any IR is built,
so a kernel never meets what it cannot compute (its compile would fail, or worse, wrap around)."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from ..ir.dtypes import is_kernel_dtype

def why_aten(graph, node) -> str | None:
    """The reason the op of `node` must run in ATen, or None where a kernel can compute it."""
    values = [v for v in pytree.tree_leaves([node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes])
              if isinstance(v, torch.Tensor)]
    for v in values:
        if not is_kernel_dtype(v.dtype):
            return f"it touches {v.dtype}, which smelt's kernels do not compute"
    for v in values:
        # Halide describes a buffer by int32 extents (Triton switches to int64 index math instead:
        # codegen/triton/kernel.py index_dtype_for).
        limit = graph.target_for(v.device.type).max_storage_elements
        if limit is not None and _storage_elements(v) > limit:
            return (f"a tensor of its ({v.dtype}{list(v.shape)}) lies in a storage of {_storage_elements(v)} "
                    f"elements, past the limit of the {v.device.type} backend ({limit})")
    return None


def _storage_elements(v: torch.Tensor) -> int:
    """Elements of the tensor's storage (at the sizes traced, for symbolic ones)."""
    try:
        nbytes = v.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        nbytes = sum((s - 1) * st for s, st in zip(v.shape, v.stride())) + 1 + v.storage_offset()
        nbytes = nbytes * v.element_size()
    if isinstance(nbytes, torch.SymInt):
        nbytes = nbytes.node.hint if nbytes.node.has_hint() else 0
    return int(nbytes) // v.element_size()
