"""The hand-written attention chain, `softmax(q @ k^T * scale + terms) @ v`, found on a Dynamo graph:
its links (lowering/handwritten_attention.py describes them) and the helpers the passes that replace
it (SDPA's, handwritten_attention.py; smelt::short_attention's, short_attention_chain.py) share."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor

_MATMULS = {torch.matmul, operator.matmul, torch.bmm}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}
_SDPA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Where a score plus the dtype's lowest value is that value (float16's spacing there is 32: it
# rounds to -inf instead).
SATURATING = (torch.bfloat16, torch.float32, torch.float64)


def is_call(node, functions=(), methods=()) -> bool:
    return isinstance(node, torch.fx.Node) and (
        (node.op == "call_function" and node.target in functions) or (node.op == "call_method" and node.target in methods))


def node_value(node):
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


def transposed_last_two(node) -> torch.fx.Node | None:
    """The tensor `node` is the last-two-dimension transpose of, or None."""
    if not is_call(node, (torch.transpose,), ("transpose",)) or len(node.args) != 3 or node.kwargs:
        return None
    ndim = node_value(node).dim()
    dims = sorted(d % ndim for d in node.args[1:] if isinstance(d, int))
    return node.args[0] if dims == [ndim - 2, ndim - 1] else None


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scale(node, scores) -> float | None:
    """The factor `node` multiplies `scores` by (a division by c is a factor 1/c), or None."""
    if node.kwargs:
        return None
    if is_call(node, (operator.mul, torch.mul), ("mul", "__mul__", "__rmul__")) and len(node.args) == 2:
        other = node.args[1] if node.args[0] is scores else node.args[0]
        return float(other) if is_number(other) else None
    if is_call(node, (operator.truediv, torch.div), ("div", "__truediv__")) and len(node.args) == 2:
        if node.args[0] is scores and is_number(node.args[1]) and node.args[1] != 0:
            return 1.0 / float(node.args[1])
    return None


def _mask(node, scores) -> torch.fx.Node | None:
    """The term `node` adds to `scores`, if it broadcasts to them and is of their dtype, or float32
    promoting half-float scores (autocast's form, which only smelt::short_attention takes)."""
    if not is_call(node, (operator.add, torch.add), ("add", "__add__", "__radd__")) or len(node.args) != 2 or node.kwargs:
        return None
    mask = node.args[1] if node.args[0] is scores else node.args[0]
    if mask is scores:  # scores + scores: no mask, twice the scores
        return None
    m, s = node_value(mask), node_value(scores)
    if not (isinstance(m, torch.Tensor) and m.device == s.device and m.dim() <= s.dim()):
        return None
    # A float32 term added to half-float scores makes float32 ones (type promotion: Swin's bias
    # table under autocast); the softmax is then float32, the probabilities cast for the product.
    if not (m.dtype == s.dtype or (m.dtype == torch.float32 and node_value(node).dtype == torch.float32)):
        return None
    return mask if torch.broadcast_shapes(m.shape, s.shape) == s.shape else None


def _softmax_output(node, scores, dtype) -> torch.fx.Node | None:
    """The node holding softmax(scores, -1) in `dtype` when `node` is that softmax (and, for a
    float32 softmax of lower-precision scores, its cast back), or None."""
    if is_call(node, (F.softmax,)):
        args = _bind(F.softmax, node)
    elif is_call(node, (torch.softmax,), ("softmax",)):
        args = _bind(lambda input, dim, dtype=None: None, node)
    else:
        return None
    if not args or args.get("input") is not scores or args.get("dim") not in (-1, node_value(scores).dim() - 1):
        return None
    # A softmax in float32 (Llama's), or in the dtype its scores already have: not one that
    # rounds float32 scores (promoted by a float32 term) to a half float first, nor float64 scores
    # to float32.
    scores_dtype = node_value(scores).dtype
    if args.get("dtype") not in (None, scores_dtype) and not (args.get("dtype") == torch.float32
                                                              and scores_dtype in (torch.float16, torch.bfloat16)):
        return None
    cast = _only_user(node)  # `.to(q.dtype)` after a float32 softmax (a no-op where q is float32)
    if is_call(cast, (), ("to",)) and node_value(cast).dtype == dtype and node_value(cast).device == node_value(node).device:
        return cast
    # Float32 probabilities of half-float q: autocast casts them for the product with v (match checks).
    return node if node_value(node).dtype in (dtype, torch.float32) else None


def _heads_unfolded(node, scores) -> torch.Size | None:
    """The shape `node` views `scores` ([batch, q, k]) as, [..., q, k] of static sizes, or None."""
    if not is_call(node, (torch.reshape,), ("view", "reshape")) or node.args[0] is not scores:
        return None
    shape, before = node_value(node).shape, node_value(scores).shape
    if (all(isinstance(n, int) for n in shape) and len(shape) > len(before)
            and shape[-2:] == before[-2:] and shape[:-2].numel() == before[:-2].numel()):
        return shape
    return None


def _fill(node, scores):
    """(mask, value) where `node` is scores.masked_fill(mask, the dtype's lowest value), or None."""
    if not is_call(node, (torch.masked_fill,), ("masked_fill",)):
        return None
    args = _bind(lambda input, mask, value: None, node)
    dtype = node_value(scores).dtype
    if not args or args["input"] is not scores or dtype not in SATURATING:
        return None
    m = node_value(args["mask"])
    if not (is_number(args["value"]) and args["value"] == torch.finfo(dtype).min and isinstance(m, torch.Tensor)
            and m.dtype == torch.bool and m.device == node_value(scores).device and m.dim() <= node_value(scores).dim()):
        return None
    if torch.broadcast_shapes(m.shape, node_value(scores).shape) != node_value(scores).shape:
        return None
    return args["mask"], args["value"]


def _inactive_dropout(node, probs) -> bool | None:
    """True where `node` is a dropout of `probs` that drops nothing, else None."""
    if not is_call(node, (F.dropout,)):
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
class Attention:
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

    def score_dtype(self) -> torch.dtype:
        """The dtype of the scores the terms are added to, the softmax's input: q's, or float32
        where float32 terms promote half-float scores."""
        at = next(i for i, link in enumerate(self.chain) if is_call(link, (F.softmax, torch.softmax), ("softmax",)))
        return node_value(self.chain[at - 1]).dtype  # each link reads the one before it

    def sdpa_takes(self) -> bool:
        """Whether the chain is one SDPA call (with at most one mask, at the scores' shape, scores
        in q's dtype)."""
        if self.score_dtype() != node_value(self.q).dtype:
            return False
        return len(self.terms) <= (self.mask is not None) and not self.folded and (
            self.heads is None or self.mask is None or node_value(self.mask).shape == node_value(self.chain[0]).shape)


def match(product: torch.fx.Node) -> Attention | None:
    """The attention whose scores `product` computes, or None."""
    if not is_call(product, _MATMULS, _MATMUL_METHODS) or len(product.args) != 2 or product.kwargs:
        return None
    q, k_t = product.args
    qv, ktv, sv = node_value(q), node_value(k_t), node_value(product)
    if not all(isinstance(t, torch.Tensor) for t in (qv, ktv, sv)) or qv.dim() < 3 or qv.dim() != ktv.dim():
        return None
    if qv.dtype not in _SDPA_DTYPES or ktv.dtype != qv.dtype or qv.shape[:-2] != ktv.shape[:-2]:
        return None
    if sv.dtype != qv.dtype:  # float32 q, k whose product autocast makes a half float
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
            if not (is_call(nxt, (torch.reshape,), ("view", "reshape")) and nxt.args[0] is chain[-1]
                    and node_value(nxt).shape == sv.shape):
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
        if not (is_call(nxt, (torch.reshape,), ("view", "reshape")) and nxt.args[0] is chain[-1]
                and node_value(nxt).shape == sv.shape):
            return None
        chain.append(nxt)
        nxt = _only_user(nxt)
    if not (is_call(nxt, _MATMULS, _MATMUL_METHODS) and len(nxt.args) == 2 and nxt.args[0] is chain[-1] and not nxt.kwargs):
        return None
    v = nxt.args[1]
    vv = node_value(v)
    if not isinstance(vv, torch.Tensor) or vv.dtype != qv.dtype or vv.shape[:-1] != ktv.shape[:-2] + ktv.shape[-1:]:
        return None
    if node_value(nxt).dtype != qv.dtype:  # float32 probabilities with no autocast to cast them
        return None
    return Attention(q, k_t, v, mask, fill, scale, heads, chain + [nxt], terms, folded)


def call_node(gm, target, *args, **kwargs) -> torch.fx.Node:
    """A new node calling `target` (a method by name), its example value computed from its inputs'."""
    method = isinstance(target, str)
    node = (gm.graph.call_method if method else gm.graph.call_function)(target, args, kwargs)
    values = [node_value(a) if isinstance(a, torch.fx.Node) else a for a in args]
    kw = {key: node_value(a) if isinstance(a, torch.fx.Node) else a for key, a in kwargs.items()}
    # Under the example values' fake mode (an op that makes a tensor of its own, SDPA over no keys,
    # must make a fake one) and the Python dispatcher, as Dynamo traces: CUDA's SDPA pads a mask of
    # symbolic length, which only the Python kernels take.
    fake_mode = next((v.fake_mode for v in [*values, *kw.values()] if isinstance(v, FakeTensor)), None)
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), enable_python_dispatcher():
        node.meta["example_value"] = getattr(values[0], target)(*values[1:], **kw) if method else target(*values, **kw)
    return node
