"""Matrix products whose rows are not 16-byte aligned, run on padded rows.

cuBLAS's tensor-core kernels read and write rows that start on 16-byte boundaries. A product
whose output rows or operand rows are of another length (GPT-2's vocabulary of 50,257 tokens: the
language-model head's logits, and their gradient in the backward) gets a kernel that moves one
element at a time: on the H100 those three products of a GPT-2 training step took 7.9 of its
20 ms of GPU time. So, for a large product:

- output rows of N elements, N not a multiple of the alignment: the second operand is copied with
  its N padded by zero columns, the product computed N-padded, and the first N columns read
  through a view (strided: the kernels after it read the padded rows in place);
- an operand whose rows are misaligned: its producer writes it into padded rows (a pad whose view
  is the value), so every product reading it, transposed or not, gets aligned rows at no extra
  pass; a graph input (a backward's incoming gradient of the logits) is copied into them, one
  pass over it against a product hundreds of times its size.

The pads are FX nodes inserted before lowering (lowering/layout_plan.py re-traces the layouts);
what a caller sees keeps eager's strides.
"""
from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

_PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default)
ALIGN_BYTES = 16
# Products smaller than this many multiply-adds are left as they are: the copies would cost more
# than the slow kernel (a 512 x 512 x 1024 product takes about 10 us either way).
MIN_MACS = 2 ** 28
# Views through which a padded operand keeps aligned rows: transposes, and reshapes that merge or
# split leading dims only (the last dim unchanged).
_TRANSPARENT_VIEWS = (aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default,
                      aten._unsafe_view.default, aten.reshape.default)


def pad_matmuls(gm: torch.fx.GraphModule, wants) -> list[torch.fx.Node]:
    """Inserts the pads described above for each product `wants(device)` says to pad; returns the
    nodes inserted (for fx_retrace), in the order they were made."""
    inserted: list[torch.fx.Node] = []
    padded: set[torch.fx.Node] = set()  # values whose readers already read padded rows
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _PRODUCTS:
            continue
        a, b = node.args[-2], node.args[-1]
        shapes = [_val(a), _val(b)]
        if any(v is None for v in shapes) or not wants(shapes[0].device):
            continue
        align = ALIGN_BYTES // shapes[0].element_size()
        m, k, n = shapes[0].shape[-2], shapes[0].shape[-1], shapes[1].shape[-1]
        if not all(isinstance(s, int) for s in (m, k, n)) or m * k * n * _batch(shapes[0]) < MIN_MACS:
            continue
        for operand in (a, b):
            source = _computed_rows(operand)
            if source is not None and _misaligned(_val(source), align) and source not in padded:
                _pad_rows(gm, source, align, inserted)
                padded.add(source)
        if n % align:
            _pad_output_columns(gm, node, n, align, inserted)
    return inserted


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) and val.dtype.is_floating_point and val.dim() >= 2 else None


def _batch(val: torch.Tensor) -> int:
    size = 1
    for s in val.shape[:-2]:
        size *= s if isinstance(s, int) else 1
    return size


def _misaligned(val, align: int) -> bool:
    """Rows (the last dim, contiguous) of a length that is not a multiple of `align`."""
    return val is not None and val.stride(-1) == 1 and val.shape[-1] > 1 and val.shape[-1] % align != 0 \
        and isinstance(val.shape[-1], int)


def _computed_rows(operand: torch.fx.Node) -> torch.fx.Node | None:
    """The value whose rows `operand` reads, through transposes and leading-dim reshapes; None
    for another view or a product's output."""
    node = operand
    while node.op == "call_function" and node.target in _TRANSPARENT_VIEWS:
        source = node.args[0]
        if node.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            if _val(source) is None or _val(source).shape[-1] != _val(node).shape[-1]:
                return None
        node = source
    if node.op not in ("call_function", "placeholder") or node.target in _PRODUCTS or _val(node) is None:
        return None  # a product's rows: see its output
    return node


def _pad_rows(gm, source: torch.fx.Node, align: int, inserted: list) -> None:
    """Every reader of `source` reads a view of it in zero-padded rows instead."""
    n = _val(source).shape[-1]
    users = list(source.users)
    # After the value, or after the last input for an input: inputs stay first in the graph.
    anchor = source if source.op != "placeholder" else list(gm.graph.find_nodes(op="placeholder"))[-1]
    with gm.graph.inserting_after(anchor):
        padded = gm.graph.call_function(aten.constant_pad_nd.default, (source, [0, -n % align]))
    with gm.graph.inserting_after(padded):
        view = gm.graph.call_function(aten.slice.Tensor, (padded, -1, 0, n))
    inserted += [padded, view]
    for user in users:
        user.replace_input_with(source, view)


def _pad_output_columns(gm, node: torch.fx.Node, n: int, align: int, inserted: list) -> None:
    """node = product(..., a, b) computed with b's last dim (and a bias's) padded, read through a view."""
    users = list(node.users)
    args = list(node.args)
    with gm.graph.inserting_before(node):
        args[-1] = gm.graph.call_function(aten.constant_pad_nd.default, (args[-1], [0, -n % align]))
        inserted.append(args[-1])
        bias = args[0] if node.target is aten.addmm.default else None
        if isinstance(bias, torch.fx.Node) and _val_any(bias) is not None and _val_any(bias).shape[-1] == n:
            args[0] = gm.graph.call_function(aten.constant_pad_nd.default, (bias, [0, -n % align]))
            inserted.append(args[0])
    node.args = tuple(args)
    with gm.graph.inserting_after(node):
        view = gm.graph.call_function(aten.slice.Tensor, (node, -1, 0, n))
    inserted.append(view)
    for user in users:
        user.replace_input_with(node, view)


def _val_any(node):
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) and val.dim() >= 1 else None
