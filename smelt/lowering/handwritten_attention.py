"""Attention written out by hand, `softmax(q @ k^T * scale + mask) @ v`, run as one SDPA call.

Models with an "eager" attention (ALBERT, older code) compute the scores, their softmax
and the product with v as separate ops: [batch, heads, queries, keys] is written and read three or
four times, and a training graph saves it for the backward. PyTorch's flash and memory-efficient
kernels compute the same thing a block of keys at a time and never write the scores. This pass
finds the chain on the Dynamo graph, before AOTAutograd, so a training graph's backward is the
kernel's too.

The chain, each link read by nothing but the next:

    scores = matmul(q, transpose(k, -2, -1))     (or k already transposed)
    scores = scores * c  |  scores / c           (optional; c a number)
    scores = scores + mask                       (optional; mask of the scores' dtype, broadcast to them)
    probs  = softmax(scores, dim=-1)             (optionally in float32, cast back to q's dtype)
    probs  = dropout(probs, p, training)         (only as a no-op: p == 0 or not training)
    out    = matmul(probs, v)

Dropout that drops is left alone: SDPA's random stream is not eager's, so results could not be
compared. So is a masked_fill of the scores: a row masked whole is NaN in eager and not in every
SDPA kernel (DeBERTa's attention, a masked_fill with the scale on k and views between the links,
stays as written). The kernels round differently from eager's ops (SDPA keeps the scores in float32
where eager rounds them to bf16): the results agree to the dtype's precision, not bit for bit.
"""
from __future__ import annotations

import inspect
import logging
import operator

import torch
import torch.fx
import torch.nn.functional as F

log = logging.getLogger("smelt.lowering")

_MATMULS = {torch.matmul, operator.matmul, torch.bmm}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}
_SDPA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is(node, functions=(), methods=()) -> bool:
    return isinstance(node, torch.fx.Node) and (
        (node.op == "call_function" and node.target in functions) or (node.op == "call_method" and node.target in methods))


def _value(node):
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _bind(function, node: torch.fx.Node):
    """`node`'s arguments by name, as `function` takes them (a method's self is its first)."""
    try:
        return inspect.signature(function).bind(*node.args, **node.kwargs).arguments
    except TypeError:
        return None


def _transposed_last_two(node) -> torch.fx.Node | None:
    """The tensor `node` is the last-two-dimension transpose of, or None."""
    if not _is(node, (torch.transpose,), ("transpose",)) or len(node.args) != 3 or node.kwargs:
        return None
    ndim = _value(node).dim()
    dims = sorted(d % ndim for d in node.args[1:] if isinstance(d, int))
    return node.args[0] if dims == [ndim - 2, ndim - 1] else None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scale(node, scores) -> float | None:
    """The factor `node` multiplies `scores` by (a division by c is a factor 1/c), or None."""
    if node.kwargs:
        return None
    if _is(node, (operator.mul, torch.mul), ("mul", "__mul__", "__rmul__")) and len(node.args) == 2:
        other = node.args[1] if node.args[0] is scores else node.args[0]
        return float(other) if _number(other) else None
    if _is(node, (operator.truediv, torch.div), ("div", "__truediv__")) and len(node.args) == 2:
        if node.args[0] is scores and _number(node.args[1]) and node.args[1] != 0:
            return 1.0 / float(node.args[1])
    return None


def _mask(node, scores) -> torch.fx.Node | None:
    """The additive mask `node` adds to `scores`, if it is one SDPA takes as it is."""
    if not _is(node, (operator.add, torch.add), ("add", "__add__", "__radd__")) or len(node.args) != 2 or node.kwargs:
        return None
    mask = node.args[1] if node.args[0] is scores else node.args[0]
    if mask is scores:  # scores + scores: no mask, twice the scores
        return None
    m, s = _value(mask), _value(scores)
    if not (isinstance(m, torch.Tensor) and m.dtype == s.dtype and m.device == s.device and m.dim() <= s.dim()):
        return None
    return mask if torch.broadcast_shapes(m.shape, s.shape) == s.shape else None


def _softmax_output(node, scores, dtype) -> torch.fx.Node | None:
    """The node holding softmax(scores, -1) in `dtype` when `node` is that softmax (and, for a
    float32 softmax of lower-precision scores, its cast back), or None."""
    if _is(node, (F.softmax,)):
        args = _bind(F.softmax, node)
    elif _is(node, (torch.softmax,), ("softmax",)):
        args = _bind(lambda input, dim, dtype=None: None, node)
    else:
        return None
    if not args or args.get("input") is not scores or args.get("dim") not in (-1, _value(scores).dim() - 1):
        return None
    if args.get("dtype") not in (None, dtype, torch.float32):
        return None
    cast = _only_user(node)  # `.to(q.dtype)` after a float32 softmax (a no-op where q is float32)
    if _is(cast, (), ("to",)) and _value(cast).dtype == dtype and _value(cast).device == _value(node).device:
        return cast
    return node if _value(node).dtype == dtype else None


def _inactive_dropout(node, probs) -> bool:
    if not _is(node, (F.dropout,)):
        return False
    args = _bind(F.dropout, node)
    return bool(args) and args.get("input") is probs and (args.get("p", 0.5) == 0 or not args.get("training", True))


def _match(product: torch.fx.Node):
    """(q, k^T, v, mask, scale, chain) of the attention whose scores `product` computes, where
    chain lists its nodes from `product` to the product with v; or None."""
    if not _is(product, _MATMULS, _MATMUL_METHODS) or len(product.args) != 2 or product.kwargs:
        return None
    q, k_t = product.args
    qv, ktv, sv = _value(q), _value(k_t), _value(product)
    if not all(isinstance(t, torch.Tensor) for t in (qv, ktv, sv)) or qv.dim() < 3 or qv.dim() != ktv.dim():
        return None
    if qv.dtype not in _SDPA_DTYPES or ktv.dtype != qv.dtype or qv.shape[:-2] != ktv.shape[:-2]:
        return None
    chain, scale, mask = [product], None, None
    nxt = _only_user(product)
    if nxt is not None and (factor := _scale(nxt, chain[-1])) is not None:
        scale = factor
        chain.append(nxt)
        nxt = _only_user(nxt)
    if nxt is not None and (found := _mask(nxt, chain[-1])) is not None:
        mask = found
        chain.append(nxt)
        nxt = _only_user(nxt)
    probs = _softmax_output(nxt, chain[-1], qv.dtype) if nxt is not None else None
    if probs is None:
        return None
    chain += [nxt] if probs is nxt else [nxt, probs]
    nxt = _only_user(probs)
    if nxt is not None and _inactive_dropout(nxt, probs):
        chain.append(nxt)
        nxt = _only_user(nxt)
    if not (_is(nxt, _MATMULS, _MATMUL_METHODS) and len(nxt.args) == 2 and nxt.args[0] is chain[-1] and not nxt.kwargs):
        return None
    v = nxt.args[1]
    vv = _value(v)
    if not isinstance(vv, torch.Tensor) or vv.dtype != qv.dtype or vv.shape[:-1] != ktv.shape[:-2] + ktv.shape[-1:]:
        return None
    return q, k_t, v, mask, scale, chain + [nxt]


def handwritten_attention_to_sdpa(gm: torch.fx.GraphModule) -> int:
    """Replaces each hand-written attention chain of `gm` (a Dynamo graph) with one SDPA call;
    returns how many."""
    rewritten, erased = 0, set()
    for node in list(gm.graph.nodes):
        found = _match(node) if node not in erased else None
        if found is None:
            continue
        q, k_t, v, mask, scale, chain = found
        out = chain[-1]
        with gm.graph.inserting_before(out):
            k = _transposed_last_two(k_t)
            if k is None:
                k = gm.graph.call_function(torch.transpose, (k_t, -2, -1))
                k.meta["example_value"] = _value(k_t).transpose(-2, -1)
            sdpa = gm.graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                          {"attn_mask": mask, "scale": 1.0 if scale is None else scale})
        sdpa.meta.update(out.meta)
        out.replace_all_uses_with(sdpa)
        if k_t.op != "placeholder" and k_t.users.keys() == {node}:
            chain.insert(0, k_t)
        for dead in reversed(chain):  # each link's one user was the next
            gm.graph.erase_node(dead)
            erased.add(dead)
        log.debug("smelt: attention written by hand at %s runs as one scaled_dot_product_attention call", node.name)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
