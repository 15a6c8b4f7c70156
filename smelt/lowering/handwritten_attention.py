"""Attention written out by hand, `softmax(q @ k^T * scale + mask) @ v`, run as one SDPA call.

Models with an "eager" attention (ALBERT, older code) compute the scores, their softmax
and the product with v as separate ops: [batch, heads, queries, keys] is written and read three or
four times, and a training graph saves it for the backward. PyTorch's flash and memory-efficient
kernels compute the same thing a block of keys at a time and never write the scores. This pass
finds the chain on the Dynamo graph, before AOTAutograd, so a training graph's backward is the
kernel's too.

The chain, each link read by nothing but the next:

    scores = matmul(q, transpose(k, -2, -1))     (or k already transposed, or so divided by a scale)
    scores = scores * c  |  scores / c           (optional; c a number)
    scores = scores + mask                       (optional; mask of the scores' dtype, broadcast to them)
    scores = scores.view(batch, heads, q, k)     (optional: heads folded into the batch for bmm)
    scores = scores.masked_fill(m, lowest)       (optional; the dtype's lowest value, float32 and wider
                                                  or bfloat16)
    probs  = softmax(scores, dim=-1)             (optionally in float32, cast back to q's dtype)
    probs  = dropout(probs, p, training)         (only as a no-op: p == 0 or not training)
    probs  = probs.view(batch * heads, q, k)     (with the view above)
    out    = matmul(probs, v)

The masked_fill becomes an additive mask: a score plus the dtype's lowest value is that value (its
spacing there, 2^104 in float32, is larger than any score), so a row masked whole stays uniform as in
eager, where -inf would make it NaN (a fill with -inf or another value is left as written). A row
filled whole gets a mask of zeros and a zeroed query instead: eager's values and gradients, which
SDPA's backward would not give it (its probabilities rebuilt from a rounded log-sum-exp, each 1).
So does a row an added mask holds at the lowest value throughout (an entry with no key): eager's
values and v's gradient; q and k get none from it, where eager's backward differentiates scores
that rounding made constant. That
is DeBERTa's attention, with its relative-position bias as the added mask and its scale on k.

Terms added after the heads are unfolded (Swin's shifted-window mask, added per window at [batch,
windows, heads, q, k], the scores folded back before the softmax) are matched too, but they are not
one SDPA mask: such chains, and any under SHORT_KEYS keys where the Target asks for it, run as one
smelt::short_attention call instead (short_attention_chain.py).

Dropout that drops is left alone: SDPA's random stream is not eager's, so results could not be
compared. The kernels round differently from eager's ops (SDPA keeps the scores in float32
where eager rounds them to bf16): the results agree to the dtype's precision, not bit for bit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor

from .written_in_place import written_in_place

log = logging.getLogger("smelt.lowering")

_MATMULS = {torch.matmul, operator.matmul, torch.bmm}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}
_SDPA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Where a score plus the dtype's lowest value is that value (float16's spacing there is 32: it
# rounds to -inf instead).
_SATURATING = (torch.bfloat16, torch.float32, torch.float64)
# Keys below which a chain stays as written, per device type: the fused kernels work on tiles of 64
# keys or more, so a shorter row is mostly padding, and scores that short take no more memory than
# q, k and v. On the H200, Swin-T's window attention (49 keys) took 3.72 GPU ms a call with 7 of its 12
# layers through cuDNN's SDPA, 3.48 with all as written (RESULTS, twenty-fourth session). The CPU's
# kernels are not measured so: every length is rewritten there.
MIN_KEYS = {"cuda": 64}
# Keys below which a chain runs as smelt::short_attention (runtime/short_attention.py) where the
# Target asks for it: the rows SDPA's kernels take slowly, which fit one of its tiles.
SHORT_KEYS = 64


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


def _heads_unfolded(node, scores) -> torch.Size | None:
    """The shape `node` views `scores` ([batch, q, k]) as, [..., q, k] of static sizes, or None."""
    if not _is(node, (torch.reshape,), ("view", "reshape")) or node.args[0] is not scores:
        return None
    shape, before = _value(node).shape, _value(scores).shape
    if (all(isinstance(n, int) for n in shape) and len(shape) > len(before)
            and shape[-2:] == before[-2:] and shape[:-2].numel() == before[:-2].numel()):
        return shape
    return None


def _fill(node, scores):
    """(mask, value) where `node` is scores.masked_fill(mask, the dtype's lowest value), or None."""
    if not _is(node, (torch.masked_fill,), ("masked_fill",)):
        return None
    args = _bind(lambda input, mask, value: None, node)
    dtype = _value(scores).dtype
    if not args or args["input"] is not scores or dtype not in _SATURATING:
        return None
    m = _value(args["mask"])
    if not (_number(args["value"]) and args["value"] == torch.finfo(dtype).min and isinstance(m, torch.Tensor)
            and m.dtype == torch.bool and m.device == _value(scores).device and m.dim() <= _value(scores).dim()):
        return None
    if torch.broadcast_shapes(m.shape, _value(scores).shape) != _value(scores).shape:
        return None
    return args["mask"], args["value"]


def _inactive_dropout(node, probs) -> bool | None:
    """True where `node` is a dropout of `probs` that drops nothing, else None."""
    if not _is(node, (F.dropout,)):
        return None
    args = _bind(F.dropout, node)
    inactive = bool(args) and args.get("input") is probs and (args.get("p", 0.5) == 0 or not args.get("training", True))
    return True if inactive else None


def _optional_link(chain: list, nxt, look):
    """(look(nxt, chain[-1]), the node after nxt) with nxt appended to chain where that finds
    something; (None, nxt) where it does not."""
    found = look(nxt, chain[-1]) if nxt is not None else None
    if found is None:
        return None, nxt
    chain.append(nxt)
    return found, _only_user(nxt)


@dataclasses.dataclass
class _Attention:
    q: torch.fx.Node
    k_t: torch.fx.Node
    v: torch.fx.Node
    mask: torch.fx.Node | None  # added to the scores
    fill: tuple | None  # (mask, value) of a masked_fill
    scale: float | None
    heads: torch.Size | None  # the scores' shape where they are viewed with their heads unfolded
    chain: list  # from the product to the product with v
    # Every added term, with the shape of the scores it is added to: `mask` at theirs, and after
    # the heads are unfolded, others at the unfolded shape, the scores then folded back before the
    # softmax (`folded`): Swin's shifted windows add their mask per window so.
    terms: list = dataclasses.field(default_factory=list)
    folded: bool = False

    def sdpa_takes(self) -> bool:
        """Whether the chain is one SDPA call (with at most one mask, at the scores' shape)."""
        return len(self.terms) <= (self.mask is not None) and not self.folded and (
            self.heads is None or self.mask is None or _value(self.mask).shape == _value(self.chain[0]).shape)


def _match(product: torch.fx.Node) -> _Attention | None:
    """The attention whose scores `product` computes, or None."""
    if not _is(product, _MATMULS, _MATMUL_METHODS) or len(product.args) != 2 or product.kwargs:
        return None
    q, k_t = product.args
    qv, ktv, sv = _value(q), _value(k_t), _value(product)
    if not all(isinstance(t, torch.Tensor) for t in (qv, ktv, sv)) or qv.dim() < 3 or qv.dim() != ktv.dim():
        return None
    if qv.dtype not in _SDPA_DTYPES or ktv.dtype != qv.dtype or qv.shape[:-2] != ktv.shape[:-2]:
        return None
    chain = [product]
    scale, nxt = _optional_link(chain, _only_user(product), _scale)
    mask, nxt = _optional_link(chain, nxt, _mask)
    terms = [(mask, sv.shape)] if mask is not None else []
    heads, nxt = _optional_link(chain, nxt, _heads_unfolded)
    folded = False
    if heads is not None:
        while (term := _optional_link(chain, nxt, _mask))[0] is not None:
            terms.append((term[0], heads))
            nxt = term[1]
        if len(terms) > (mask is not None):  # terms at the unfolded shape: folded back right after them
            if not (_is(nxt, (torch.reshape,), ("view", "reshape")) and nxt.args[0] is chain[-1]
                    and _value(nxt).shape == sv.shape):
                return None
            chain.append(nxt)
            nxt, folded = _only_user(nxt), True
    fill, nxt = _optional_link(chain, nxt, _fill)
    probs = _softmax_output(nxt, chain[-1], qv.dtype) if nxt is not None else None
    if probs is None:
        return None
    chain += [nxt] if probs is nxt else [nxt, probs]
    _, nxt = _optional_link(chain, _only_user(probs), _inactive_dropout)
    if heads is not None and not folded:  # folded back for the product with v
        if not (_is(nxt, (torch.reshape,), ("view", "reshape")) and nxt.args[0] is chain[-1]
                and _value(nxt).shape == sv.shape):
            return None
        chain.append(nxt)
        nxt = _only_user(nxt)
    if not (_is(nxt, _MATMULS, _MATMUL_METHODS) and len(nxt.args) == 2 and nxt.args[0] is chain[-1] and not nxt.kwargs):
        return None
    v = nxt.args[1]
    vv = _value(v)
    if not isinstance(vv, torch.Tensor) or vv.dtype != qv.dtype or vv.shape[:-1] != ktv.shape[:-2] + ktv.shape[-1:]:
        return None
    return _Attention(q, k_t, v, mask, fill, scale, heads, chain + [nxt], terms, folded)


def _call(gm, target, *args, **kwargs) -> torch.fx.Node:
    """A new node calling `target` (a method by name), its example value computed from its inputs'."""
    method = isinstance(target, str)
    node = (gm.graph.call_method if method else gm.graph.call_function)(target, args, kwargs)
    values = [_value(a) if isinstance(a, torch.fx.Node) else a for a in args]
    kw = {key: _value(a) if isinstance(a, torch.fx.Node) else a for key, a in kwargs.items()}
    # Under the example values' fake mode (an op that makes a tensor of its own, SDPA over no keys,
    # must make a fake one) and the Python dispatcher, as Dynamo traces: CUDA's SDPA pads a mask of
    # symbolic length, which only the Python kernels take.
    fake_mode = next((v.fake_mode for v in [*values, *kw.values()] if isinstance(v, FakeTensor)), None)
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), enable_python_dispatcher():
        node.meta["example_value"] = getattr(values[0], target)(*values[1:], **kw) if method else target(*values, **kw)
    return node


def handwritten_attention_to_sdpa(gm: torch.fx.GraphModule, short_kernel=lambda device_type, training: False) -> int:
    """Replaces each hand-written attention chain of `gm` (a Dynamo graph) with one SDPA call, or
    one smelt::short_attention call where `short_kernel(device type, whether it needs gradients)`
    says so and it applies; returns how many."""
    from . import short_attention_chain  # it reads this module's matcher
    rewritten, erased = 0, set()
    # Compiled with gradients off and never turning them on: no value needs one, whatever its
    # requires_grad (a leaf passed in under no_grad keeps it).
    no_gradients = not torch.is_grad_enabled() and not any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes)
    for node in list(gm.graph.nodes):
        found = _match(node) if node not in erased else None
        if found is None:
            continue
        chain, k_t = found.chain, found.k_t
        out = chain[-1]
        keys = _value(k_t).shape[-1]
        device_type = _value(k_t).device.type
        if written_in_place(out):  # SDPA's fused kernels save the output the program writes
            log.debug("smelt: attention written by hand at %s left as written: its output is written in place",
                      node.name)
            continue
        short = (isinstance(keys, int) and keys < SHORT_KEYS and short_attention_chain.kernel_takes(found)
                 and short_kernel(device_type, short_attention_chain.needs_gradients(found, no_gradients)))
        if short:
            make, kind = short_attention_chain.short_attention_nodes, "one smelt::short_attention call"
        elif isinstance(keys, int) and keys < MIN_KEYS.get(device_type, 0):
            log.debug("smelt: attention written by hand at %s left as written: %d keys", node.name, keys)
            continue
        elif not found.sdpa_takes():
            log.debug("smelt: attention written by hand at %s left as written: its %d added terms are not one "
                      "SDPA mask", node.name, len(found.terms))
            continue
        else:
            make, kind = _sdpa_nodes, "one scaled_dot_product_attention call"
        before = set(gm.graph.nodes)
        try:
            result = make(gm, found)
        except Exception as e:  # a chain the call cannot trace (an example value it fails on) stays as written
            for new in reversed([n for n in gm.graph.nodes if n not in before]):
                gm.graph.erase_node(new)
            log.debug("smelt: attention written by hand at %s left as written: %s over its inputs "
                      "failed to trace (%s: %s)", node.name, kind, type(e).__name__, e)
            continue
        # The call's own example value stands (short_attention's strides may differ from the product's).
        result.meta.update({key: value for key, value in out.meta.items() if not (short and key == "example_value")})
        out.replace_all_uses_with(result)
        producers = [k_t] + ([node.args[0]] if short and short_attention_chain.q_scale_of(found) is not None else [])
        for producer in producers:
            if producer.op != "placeholder" and producer.users.keys() == {node}:
                chain.insert(0, producer)
        for dead in reversed(chain):  # each link's one user was the next
            gm.graph.erase_node(dead)
            erased.add(dead)
        log.debug("smelt: attention written by hand at %s runs as %s", node.name, kind)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _sdpa_nodes(gm: torch.fx.GraphModule, found: _Attention) -> torch.fx.Node:
    """New nodes computing `found`'s chain as one SDPA call, before its last link; returns the
    node of its result."""
    out, k_t = found.chain[-1], found.k_t
    with gm.graph.inserting_before(out):
        k = _transposed_last_two(k_t)
        if k is None:
            k = _call(gm, torch.transpose, k_t, -2, -1)
        q, v, mask = found.q, found.v, found.mask
        if found.heads is not None:  # SDPA over [batch, heads, ...]: its kernels take four dimensions
            lead = tuple(found.heads[:-2])
            q, k, v = (_call(gm, torch.reshape, t, lead + tuple(_value(t).shape[-2:])) for t in (q, k, v))
            if mask is not None:
                mask = _call(gm, torch.reshape, mask, tuple(found.heads))
        if found.fill is not None:
            where, value = found.fill
            # A query whose keys are all filled has constant scores: a uniform softmax that passes q
            # and k no gradient (a fill's backward passes none). SDPA's backward rebuilds its
            # probabilities from a log-sum-exp that rounds to the lowest value there (each 1, not
            # 1/keys): its mask is 0 on such a row and its query zeroed (the same values; no
            # gradient through it).
            dtype = _value(q).dtype
            kept = _call(gm, "to", _call(gm, torch.any, _call(gm, torch.logical_not, where), -1, keepdim=True), dtype)
            q = _call(gm, operator.mul, q, kept)
            fill_value = _call(gm, operator.mul, kept, value)
            mask = _call(gm, torch.where, where, fill_value, 0.0 if mask is None else mask)
        elif mask is not None and _value(mask).dtype in _SATURATING:
            # The same for a row the added mask holds at the lowest value throughout (an entry
            # with no key): its scores round to that value, eager's softmax is uniform.
            dtype = _value(q).dtype
            kept = _call(gm, torch.any, _call(gm, operator.ne, mask, torch.finfo(dtype).min), -1, keepdim=True)
            q = _call(gm, operator.mul, q, _call(gm, "to", kept, dtype))
            mask = _call(gm, torch.where, kept, mask, 0.0)
        sdpa = _call(gm, F.scaled_dot_product_attention, q, k, v, attn_mask=mask,
                     scale=1.0 if found.scale is None else found.scale)
        result = sdpa
        if found.heads is not None:
            result = _call(gm, torch.reshape, sdpa, tuple(_value(out).shape))
    return result
