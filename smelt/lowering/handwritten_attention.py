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
    scores = scores + mask                       (optional; mask of the scores' dtype, broadcast to them,
                                                  or float32 promoting half-float scores: autocast's
                                                  form, which SDPA is not given)
    scores = scores.view(batch, heads, q, k)     (optional: heads folded into the batch for bmm)
    scores = scores.masked_fill(m, lowest)       (optional; the dtype's lowest value, float32 and wider
                                                  or bfloat16)
    probs  = softmax(scores, dim=-1)             (optionally in float32, cast back to q's dtype or
                                                  left float32 for autocast's product to cast)
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

import logging
import operator

import torch
import torch.fx
import torch.nn.functional as F

from . import short_attention_chain
from .attention_chain import SATURATING, Attention, call_node, match, node_value, transposed_last_two
from .written_in_place import memory_writers, written_in_place

log = logging.getLogger("smelt.lowering")

# Keys below which a chain stays as written, per device type: the fused kernels work on tiles of 64
# keys or more, so a shorter row is mostly padding, and scores that short take no more memory than
# q, k and v. On the H200, Swin-T's window attention (49 keys) took 3.72 GPU ms a call with 7 of its 12
# layers through cuDNN's SDPA, 3.48 with all as written (RESULTS, twenty-fourth session). The CPU's
# kernels are not measured so: every length is rewritten there.
MIN_KEYS = {"cuda": 64}
# Keys below which a chain runs as smelt::short_attention (runtime/short_attention.py) where the
# Target asks for it: the rows SDPA's kernels take slowly, which fit one of its tiles.
SHORT_KEYS = 64


def handwritten_attention_to_sdpa(gm: torch.fx.GraphModule, short_kernel=lambda device_type, training: False) -> int:
    """Replaces each hand-written attention chain of `gm` (a Dynamo graph) with one SDPA call, or
    one smelt::short_attention call where `short_kernel(device type, whether it needs gradients)`
    says so and it applies; returns how many."""
    rewritten, erased = 0, set()
    # Compiled with gradients off and never turning them on: no value needs one, whatever its
    # requires_grad (a leaf passed in under no_grad keeps it).
    no_gradients = not torch.is_grad_enabled() and not any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}  # numbered again after each rewrite
    for node in list(gm.graph.nodes):
        found = match(node) if node not in erased else None
        if found is None:
            continue
        chain, k_t = found.chain, found.k_t
        out = chain[-1]
        keys = node_value(k_t).shape[-1]
        device_type = node_value(k_t).device.type
        if written_in_place(out):  # SDPA's fused kernels save the output the program writes
            log.debug("smelt: attention written by hand at %s left as written: its output is written in place",
                      node.name)
            continue
        # The call reads the chain's operands where its last op runs: none may be written in place
        # between the op that read it (or a query's scale the call absorbs) and that point.
        reads = [(found.q, node), (k_t, node), *[(x, found.q) for x in found.q.args if isinstance(x, torch.fx.Node)],
                 *[(term, next((link for link in chain if term in link.args), node)) for term, _ in found.terms]]
        if any(order[read] < order.get(w, -1) < order[out] for operand, read in reads for w in memory_writers(operand)):
            log.debug("smelt: attention written by hand at %s left as written: an operand is written in place "
                      "inside the chain", node.name)
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
        order = {n: i for i, n in enumerate(gm.graph.nodes)}  # a later chain may read this one's nodes
    if rewritten:
        gm.recompile()
    return rewritten


def _sdpa_nodes(gm: torch.fx.GraphModule, found: Attention) -> torch.fx.Node:
    """New nodes computing `found`'s chain as one SDPA call, before its last link; returns the
    node of its result."""
    out, k_t = found.chain[-1], found.k_t
    with gm.graph.inserting_before(out):
        k = transposed_last_two(k_t)
        if k is None:
            k = call_node(gm, torch.transpose, k_t, -2, -1)
        q, v, mask = found.q, found.v, found.mask
        if found.heads is not None:  # SDPA over [batch, heads, ...]: its kernels take four dimensions
            lead = tuple(found.heads[:-2])
            q, k, v = (call_node(gm, torch.reshape, t, lead + tuple(node_value(t).shape[-2:])) for t in (q, k, v))
            if mask is not None:
                mask = call_node(gm, torch.reshape, mask, tuple(found.heads))
        if found.fill is not None:
            where, value = found.fill
            # A query whose keys are all filled has constant scores: a uniform softmax that passes q
            # and k no gradient (a fill's backward passes none). SDPA's backward rebuilds its
            # probabilities from a log-sum-exp that rounds to the lowest value there (each 1, not
            # 1/keys): its mask is 0 on such a row and its query zeroed (the same values; no
            # gradient through it).
            dtype = node_value(q).dtype
            kept = call_node(gm, "to", call_node(gm, torch.any, call_node(gm, torch.logical_not, where), -1, keepdim=True), dtype)
            q = call_node(gm, operator.mul, q, kept)
            fill_value = call_node(gm, operator.mul, kept, value)
            mask = call_node(gm, torch.where, where, fill_value, 0.0 if mask is None else mask)
        elif mask is not None and node_value(mask).dtype in SATURATING:
            # The same for a row the added mask holds at the lowest value throughout (an entry
            # with no key): its scores round to that value, eager's softmax is uniform.
            dtype = node_value(q).dtype
            kept = call_node(gm, torch.any, call_node(gm, operator.ne, mask, torch.finfo(dtype).min), -1, keepdim=True)
            q = call_node(gm, operator.mul, q, call_node(gm, "to", kept, dtype))
            mask = call_node(gm, torch.where, kept, mask, 0.0)
        sdpa = call_node(gm, F.scaled_dot_product_attention, q, k, v, attn_mask=mask,
                     scale=1.0 if found.scale is None else found.scale)
        result = sdpa
        if found.heads is not None:
            result = call_node(gm, torch.reshape, sdpa, tuple(node_value(out).shape))
    return result
