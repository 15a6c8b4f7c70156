"""Hand-written attention chains (lowering/attention_chain.py) as one
smelt::short_attention call (runtime/short_attention.py): which chains the kernel takes, and the
call that replaces one, its query's scale by a number and the scores' scale absorbed."""
from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from .attention_chain import Attention, call_node, is_call, is_number, node_value, transposed_last_two


def q_scale_of(found: Attention) -> tuple | None:
    """(x, c) where the chain's query is x * c (a number) read by nothing but the product (Swin
    scales its query so), else None."""
    q = found.q
    if not (is_call(q, (operator.mul, torch.mul), ("mul", "__mul__", "__rmul__")) and len(q.args) == 2
            and not q.kwargs and len(q.users) == 1):
        return None
    x, c = q.args if isinstance(q.args[0], torch.fx.Node) else q.args[::-1]
    xv = node_value(x)
    if not (is_number(c) and isinstance(xv, torch.Tensor) and xv.dtype == node_value(q).dtype and xv.shape == node_value(q).shape):
        return None
    return x, float(c)


def _score_scale_of(found: Attention) -> tuple[float, bool]:
    """(c, whether the scores are divided by it) for the chain's scale link; (1.0, False) without one."""
    if found.scale is None:
        return 1.0, False
    link = found.chain[1]
    if is_call(link, (operator.truediv, torch.div), ("div", "__truediv__")):
        return float(link.args[1]), True
    return found.scale, False


def _chain_operands(found: Attention) -> list:
    """The example values the short kernel would read: q (before a scale it absorbs), k^T, v, the terms."""
    scaled = q_scale_of(found)
    q_node = scaled[0] if scaled is not None else found.q
    return [node_value(q_node), node_value(found.k_t), node_value(found.v), *[node_value(t) for t, _ in found.terms]]


def needs_gradients(found: Attention, no_gradients: bool) -> bool:
    return not no_gradients and any(isinstance(t, torch.Tensor) and t.requires_grad for t in _chain_operands(found))


def kernel_takes(found: Attention) -> bool:
    """Whether smelt::short_attention computes the chain: no masked_fill, operands the kernel takes."""
    from ..runtime import short_attention
    if found.fill is not None:
        return False
    tensors = _chain_operands(found)
    q, k_t, v, *terms = tensors
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    if any(not isinstance(n, int) for t in tensors for n in t.shape):
        return False  # symbolic sizes: the kernel's blocks are fixed per compile
    for (_, shape) in found.terms:
        if len(shape) - 2 > 4:
            return False
    expanded = [t.expand(shape) for t, (_, shape) in zip(terms, found.terms)]
    return short_attention.applies(q, k_t.transpose(-2, -1), v, expanded)


def short_attention_nodes(gm: torch.fx.GraphModule, found: Attention) -> torch.fx.Node:
    """A smelt::short_attention node computing `found`'s chain, before its last link."""
    from ..runtime import short_attention  # noqa: F401  (registers the op)
    out, k_t = found.chain[-1], found.k_t
    scaled = q_scale_of(found)
    q, q_scale = scaled if scaled is not None else (found.q, 1.0)
    score_scale, divides = _score_scale_of(found)
    heads_last = _heads_concatenated_next(out)
    with gm.graph.inserting_before(out):
        k = transposed_last_two(k_t)
        if k is None:
            k = call_node(gm, torch.transpose, k_t, -2, -1)
        terms = [call_node(gm, "expand", term, tuple(shape)) for term, shape in found.terms]
        op = torch.ops.smelt.short_attention.default
        # Llama's form: a float32 softmax of half-float scores, cast back (its backward reads float32).
        float32_softmax = node_value(found.q).dtype != torch.float32 and any(
            is_call(link, (F.softmax, torch.softmax), ("softmax",)) and node_value(link).dtype == torch.float32
            for link in found.chain)
        args = (q_scale, score_scale, divides, heads_last, float32_softmax)
        node = gm.graph.call_function(op, (q, k, found.v, terms, *args))
        values = [node_value(q), node_value(k), node_value(found.v), [node_value(t) for t in terms]]
        fake_mode = next((v.fake_mode for v in values[:3] if isinstance(v, FakeTensor)), None)
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            node.meta["example_value"] = op(*values, *args)
    return node


def _heads_concatenated_next(out: torch.fx.Node) -> bool:
    """Whether the chain's [batch, heads, q, dv] result is only transposed to [batch, q, heads, dv]
    and reshaped to [batch, q, heads * dv] (Swin's): stored heads-last, both are views, and the
    reshape's result is contiguous as eager's is (a transposed view a caller receives would not be)."""
    users = list(out.users)
    if not (node_value(out).dim() == 4 and len(users) == 1 and is_call(users[0], (torch.transpose,), ("transpose",))
            and users[0].args[0] is out and len(users[0].args) == 3
            and sorted(d % 4 for d in users[0].args[1:3] if isinstance(d, int)) == [1, 2]):
        return False
    after = list(users[0].users)
    if len(after) != 1 or not is_call(after[0], (torch.reshape,), ("reshape", "view")) or after[0].args[0] is not users[0]:
        return False
    b, h, n, d = node_value(out).shape
    return tuple(node_value(after[0]).shape) == (b, n, h * d)
