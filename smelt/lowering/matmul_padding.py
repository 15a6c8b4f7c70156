"""Matrix products with misaligned dimensions, run zero-padded.

cuBLAS's tensor-core kernels move 16 bytes at a time along each matrix's contiguous dimension;
where one of those extents is not a multiple of 16 bytes (GPT-2's vocabulary of 50,257 tokens) it
picks a kernel that moves one element at a time. In a GPT-2 training step on the H100 the three
products over the vocabulary took 7.9 of its 20 ms of GPU time that way. So, for a large product
out[M, N] = a[M, K] @ b[K, N] (batched or not), each dimension that is misaligned is padded with
zeros, which change no sum:

- K (the contraction), in both operands; where b holds K along its rows (a weight read as [K, N])
  and is bigger than the result, b is read in place instead: the product over K's aligned part, on
  a's zero-padded rows and b's first rows, adds the small product over the last few rows;
- M, where a is read transposed (its M is contiguous: the head's weight gradient, grad^T @ x);
  the output's first M rows are read through a view;
- N, in b (and a bias); the output's first N columns are read through a view (strided: the
  kernels after it read the padded rows in place).

An operand whose padded dimension is the last one of a value the graph computes (through
transposes and reshapes that keep the last dim) gets that value written by its producer into
zero-padded rows: the pad is fused into the kernel computing it, every other reader reads a view of
the padded rows, and every product reading it, transposed or not, reads the padded value. A graph
input (a backward's incoming gradient of the logits) is copied into them: one pass over it
against a product hundreds of times its size. Any other operand is copied with its pad.

The pads are FX nodes inserted before lowering (lowering/layout_plan.py re-traces the layouts);
what a caller sees keeps eager's strides, with one exception: a 2-D product padded in N that is read
only through the copy into eager's rows (an inference graph's logits) runs as smelt::padded_product
(runtime/padded_product.py) and the caller gets its first N columns as a view of the padded rows,
as Inductor returns them: that copy was a pass over the whole product. An operand the pass had
copied with its pad (a weight) goes unpadded there, so that copy is not made either.
"""
from __future__ import annotations

import torch
import torch.fx

from ..runtime import padded_product  # noqa: F401  (registers smelt::padded_product)

aten = torch.ops.aten

_PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
_BIASED = (aten.addmm.default, aten.baddbmm.default)  # beta * args[0] + alpha * (a @ b)
ALIGN_BYTES = 16
# Products smaller than this many multiply-adds are left as they are: the copies would cost more
# than the slow kernel (a 512 x 512 x 1024 product takes about 10 us either way).
MIN_MACS = 2 ** 28
# A batch of matrices each smaller than one tile of cuBLAS's tensor-core kernels (about 128 x 128 x 64)
# is left as it is too: a partial tile runs about as fast misaligned, and a K pad breaks the fusion
# of the operand's producer. Swin-T's window attention (6144 products of 49 x 32 x 49, then 49 x 49 x 32)
# had its softmax written again by a second kernel into rows of 56 (0.58 ms): its bf16 inference on the
# H200 took 3.76 GPU ms a call padded, 3.48 not (attention as written; RESULTS, twenty-fourth session).
MIN_MATRIX_MACS = 128 * 128 * 64
_PERMUTES = (aten.permute.default, aten.t.default, aten.transpose.int)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def pad_matmuls(gm: torch.fx.GraphModule, wants) -> list[torch.fx.Node]:
    """Pads the products `wants(device, dtype)` says to pad, as described above; returns the nodes
    inserted (for fx_retrace), in the order they were made."""
    inserted: list[torch.fx.Node] = []
    # value -> its zero-padded rows; ("rows of", the view of them its readers read) -> value
    padded_sources: dict = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _PRODUCTS:
            continue
        a, b = node.args[-2], node.args[-1]
        va, vb = _val(a), _val(b)
        if va is None or vb is None or not wants(va.device, va.dtype):
            continue
        align = ALIGN_BYTES // va.element_size()
        m, k, n = va.shape[-2], va.shape[-1], vb.shape[-1]
        if not all(isinstance(s, int) for s in (m, k, n)) or m * k * n * _batch(va) < MIN_MACS \
                or m * k * n < MIN_MATRIX_MACS:
            continue
        pad_m = -m % align if va.stride(-2) == 1 and va.shape[-1] > 1 else 0
        pad_k, pad_n = -k % align, -n % align
        if not (pad_m or pad_k or pad_n):
            continue
        # b's K along its rows (a weight read as [K, N]): b is read in place, the contraction split
        # at its last aligned row instead of b copied with zero rows (GPT-2's tied head: 77 MB),
        # where b is bigger than the result (the split writes and reads a second result).
        split_k = pad_k and not pad_n and vb.stride(-2) != 1 and align <= k and m < k
        with gm.graph.inserting_before(node):
            new_a = _zero_padded(gm, a, {-2: pad_m, -1: pad_k}, padded_sources, align, inserted)
            new_b = b if split_k else _zero_padded(gm, b, {-2: pad_k, -1: pad_n}, padded_sources, align, inserted)
            args = list(node.args)
            args[-2], args[-1] = new_a, new_b
            if node.target in _BIASED:
                args[0] = _padded_bias(gm, args[0], m, n, pad_m, pad_n, inserted)
        if split_k:
            node = _split_contraction(gm, node, args, k - k % align, k, inserted)
        else:
            node.args = tuple(args)
        if pad_m or pad_n:
            _read_through_view(gm, node, m, n, pad_m, pad_n, inserted)
    return inserted


def _split_contraction(gm, node: torch.fx.Node, args: list, aligned: int, k: int, inserted: list) -> torch.fx.Node:
    """`node` with `args` (a padded in K, b not) as the product over the first `aligned` of K,
    aligned in both operands, added by cuBLAS to the small product over the rest; returns the node
    that replaces it. `node` is left dead with its own arguments, for a Checkpoint to restore."""
    a, b = args[-2], args[-1]
    rank = _val(b).dim()
    with gm.graph.inserting_before(node):
        parts = [gm.graph.call_function(aten.slice.Tensor, (operand, dim, start, end))
                 for start, end in ((0, aligned), (aligned, k)) for operand, dim in ((a, rank - 1), (b, rank - 2))]
        a_main, b_main, a_rest, b_rest = parts
        if node.target is aten.bmm.default:
            rest = gm.graph.call_function(aten.bmm.default, (a_rest, b_rest))
            whole = gm.graph.call_function(aten.baddbmm.default, (rest, a_main, b_main))
        elif node.target in _BIASED:
            # beta * bias + alpha * (a_rest @ b_rest), then + alpha * (a_main @ b_main)
            alpha = node.kwargs.get("alpha", 1)
            rest = gm.graph.call_function(node.target, (args[0], a_rest, b_rest), dict(node.kwargs))
            whole = gm.graph.call_function(node.target, (rest, a_main, b_main),
                                           {"alpha": alpha} if alpha != 1 else {})
        else:
            rest = gm.graph.call_function(aten.mm.default, (a_rest, b_rest))
            whole = gm.graph.call_function(aten.addmm.default, (rest, a_main, b_main))
    inserted += [*parts, rest, whole]
    node.replace_all_uses_with(whole)
    return whole


def _zero_padded(gm, operand: torch.fx.Node, pads: dict[int, int], padded_sources, align, inserted):
    """`operand` with zeros appended to its last two dims, by `pads` (-2 and -1 -> count)."""
    pads = {d: p for d, p in pads.items() if p}
    if not pads:
        return operand
    if len(pads) == 1:
        ((dim, _),) = pads.items()
        reused = _through_padded_source(gm, operand, dim, padded_sources, align, inserted)
        if reused is not None:
            return reused
    spec = [0, pads.get(-1, 0), 0, pads.get(-2, 0)] if -2 in pads else [0, pads[-1]]
    copy = gm.graph.call_function(aten.constant_pad_nd.default, (operand, spec))
    inserted.append(copy)
    return copy


def _through_padded_source(gm, operand, dim: int, padded_sources, align, inserted):
    """`operand` read from its source's zero-padded rows, where `dim` of `operand` is its source's
    last dim through transposes and reshapes that keep the last dim; None elsewhere."""
    chain = []  # the views from the source up to the operand
    node = operand
    while node.op == "call_function" and node.target in _PERMUTES + _RESHAPES:
        if _val(node) is None:
            return None
        rank = _val(node).dim()
        # A view _pad_rows made reads the value it was made for: the walk goes on from the value.
        source = padded_sources.get(("rows of", node.args[0]), node.args[0])
        if node.target in _RESHAPES:
            if _val(source) is None or dim % rank != rank - 1 or _val(source).shape[-1] != _val(node).shape[-1] \
                    or list(node.args[1])[-1] != _val(node).shape[-1]:
                return None
            dim = -1
        else:
            dim = _permuted_from(node, dim % rank) - rank
        chain.append(node)
        node = source
    node = padded_sources.get(("rows of", node), node)
    val = _val(node)
    if node.op not in ("call_function", "placeholder") or node.target in _PRODUCTS or val is None \
            or dim % val.dim() != val.dim() - 1 or val.stride(-1) != 1:
        return None
    if node not in padded_sources:
        padded_sources[node] = _pad_rows(gm, node, align, inserted)
        padded_sources[("rows of", inserted[-1])] = node
    padded = padded_sources[node]
    length = _val(node).shape[-1] + (-_val(node).shape[-1] % align)
    for view in reversed(chain):
        args = list(view.args)
        args[0] = padded
        if view.target in _RESHAPES:
            args[1] = [*list(args[1])[:-1], length]
        padded = gm.graph.call_function(view.target, tuple(args), dict(view.kwargs))
        inserted.append(padded)
    return padded


def _permuted_from(view: torch.fx.Node, dim: int) -> int:
    """The input dim (non-negative) a transposing view's output `dim` reads."""
    rank = _val(view).dim()
    if view.target is aten.permute.default:
        return list(view.args[1])[dim] % rank
    if view.target is aten.t.default:
        return (1 - dim) if rank == 2 else dim
    d0, d1 = (d % rank for d in view.args[1:3])
    return d1 if dim == d0 else d0 if dim == d1 else dim


def _pad_rows(gm, source: torch.fx.Node, align: int, inserted: list) -> torch.fx.Node:
    """Every reader of `source` reads a view of it in zero-padded rows instead; returns the padded
    value. Not a write into it (the write-back of an input updated in place would land in the
    padded copy, and the caller's tensor keep its old value), nor the graph's output for an input
    (a saved input costs nothing where it is) or for a value not laid out as dense rows: a forward
    saving it so hands the backward a layout it did not trace (an expanded vector's unsqueeze saved
    for a product's backward: fuzz seed 4327)."""
    val = _val(source)
    n = val.shape[-1]
    dense_rows = all(isinstance(x, int) for x in (*val.shape, *val.stride())) and val.is_contiguous()
    keeps_output = source.op == "placeholder" or not dense_rows  # (symbolic strides: not known to be)
    users = [u for u in source.users if not _writes_into(u, source) and not (keeps_output and u.op == "output")]
    # After the value, or after the last input for an input: inputs stay first in the graph.
    anchor = source if source.op != "placeholder" else list(gm.graph.find_nodes(op="placeholder"))[-1]
    with gm.graph.inserting_after(anchor):
        padded = gm.graph.call_function(aten.constant_pad_nd.default, (source, [0, -n % align]))
    with gm.graph.inserting_after(padded):
        view = gm.graph.call_function(aten.slice.Tensor, (padded, -1, 0, n))
    inserted += [padded, view]
    for user in users:
        user.replace_input_with(source, view)
    return padded


def _writes_into(node: torch.fx.Node, source: torch.fx.Node) -> bool:
    """Whether `node` is an op that writes into `source` (an argument its schema marks as written)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return False
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    arguments = dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)
    return any(arguments.get(name) is source for name in written)


def _padded_bias(gm, bias, m: int, n: int, pad_m: int, pad_n: int, inserted: list):
    """An addmm's or baddbmm's added term, padded where it spans the padded output dims (not where
    it broadcasts)."""
    val = _val_any(bias) if isinstance(bias, torch.fx.Node) else None
    if val is None:
        return bias
    pad_n = pad_n if val.shape[-1] == n else 0
    pad_m = pad_m if val.dim() >= 2 and val.shape[-2] == m else 0
    if not (pad_m or pad_n):
        return bias
    padded = gm.graph.call_function(aten.constant_pad_nd.default, (bias, [0, pad_n, 0, pad_m] if pad_m else [0, pad_n]))
    inserted.append(padded)
    return padded


def _read_through_view(gm, node: torch.fx.Node, m: int, n: int, pad_m: int, pad_n: int, inserted: list) -> None:
    """The product's readers read its first m rows and n columns."""
    users = list(node.users)
    view = node
    for dim, size, pad in ((-1, n, pad_n), (-2, m, pad_m)):
        if pad:
            with gm.graph.inserting_after(view):
                view = gm.graph.call_function(aten.slice.Tensor, (view, dim, 0, size))
            inserted.append(view)
    for user in users:
        user.replace_input_with(node, view)


def products_into_copies(gm: torch.fx.GraphModule) -> bool:
    """Each `clone(views(slice(mm(a, b), -1, 0, n)))` whose product and slice have no other reader
    computes smelt::padded_product(a, b, bias, n) and its views instead: the first n columns of
    the padded rows, with no copy into eager's (see the module docstring).
    Returns whether it changed the graph; the product, slice and clone are left for dead-code
    elimination, the metadata of what it inserted for a re-trace."""
    changed = False
    for clone in list(gm.graph.find_nodes(op="call_function", target=aten.clone.default)):
        views, node = [], clone.args[0]
        while isinstance(node, torch.fx.Node) and node.target in _RESHAPES and len(node.users) == 1:
            views.append(node)
            node = node.args[0]
        if not (isinstance(node, torch.fx.Node) and node.target is aten.slice.Tensor and len(node.users) == 1):
            continue
        product, dim, start, end, step = slice_arguments(node)
        if not (isinstance(product, torch.fx.Node) and product.target in (aten.mm.default, aten.addmm.default)
                and len(product.users) == 1 and dim in (-1, 1) and start in (0, None) and isinstance(end, int)
                and step == 1 and not node.kwargs):
            continue
        val = _val(product)
        if val is None or val.dim() != 2 or not 0 < end < val.shape[-1] or clone.kwargs.get("memory_format") not in (
                None, torch.contiguous_format):
            continue
        bias = product.args[0] if product.target is aten.addmm.default else None
        if product.kwargs or (bias is not None and len(product.args) != 3):
            continue  # addmm's beta / alpha
        with gm.graph.inserting_before(clone):
            result = gm.graph.call_function(torch.ops.smelt.padded_product.default,
                                            (product.args[-2], _unpadded(product.args[-1], end),
                                             _unpadded(bias, end), end))
            for view in reversed(views):
                result = gm.graph.call_function(view.target, (result, *view.args[1:]), dict(view.kwargs))
        clone.replace_all_uses_with(result)
        changed = True
    return changed


def slice_arguments(node: torch.fx.Node) -> tuple:
    """(input, dim, start, end, step) of an `aten.slice.Tensor` node, its defaults filled in."""
    return (*node.args, *(0, None, None, 1)[len(node.args) - 1:])


def _unpadded(node, n: int):
    """What a `constant_pad_nd` of zeros after the last dim padded to more than `n`, where it had
    `n` there (the padded copy of a weight: smelt::padded_product reads the weight itself, its
    aligned columns in place, so the copy is left dead); else `node`."""
    if not (isinstance(node, torch.fx.Node) and node.target is aten.constant_pad_nd.default):
        return node
    source, spec = node.args[0], list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0)
    val = _val_any(source) if isinstance(source, torch.fx.Node) else None
    if val is None or value != 0 or len(spec) != 2 or spec[0] != 0 or val.shape[-1] != n:
        return node
    return source


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) and val.dtype.is_floating_point and val.dim() >= 2 else None


def _val_any(node):
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) and val.dim() >= 1 else None


def _batch(val: torch.Tensor) -> int:
    size = 1
    for s in val.shape[:-2]:
        size *= s if isinstance(s, int) else 1
    return size
