"""Attention masks made dense along their last dimension before SDPA, on CUDA.

`scaled_dot_product_attention` picks its kernel when AOTAutograd traces it, from the arguments'
layouts: PyTorch's flash and memory-efficient CUDA kernels take an additive mask only if its last
dimension is contiguous (sdp_utils' last-dim-stride check; the CPU's flash kernel takes any).
Otherwise the call is traced as the math path, which materializes the scores and their softmax in
float32: [batch, heads, queries, keys] twice. T5 builds its position bias as a permute of an
embedding (last-dimension stride = heads), so every T5 attention ran that way (its bf16 inference
peak held both 64 MiB tensors on the H200, fourteenth session). A copy of the mask with that
dimension dense costs at most one such tensor, in the mask's dtype (a boolean mask, one byte an
element), and lets the memory-efficient kernel run, which reads the mask and writes no scores.
Eager runs the math path on the same call: the results differ by the kernels' rounding, not by
what they compute.

This runs on the Dynamo graph, before AOTAutograd, so a training graph's backward is the kernel's.
A call whose output the program writes in place is left as it is (written_in_place.py).
"""
from __future__ import annotations

import logging

import torch
import torch.fx

from .written_in_place import written_in_place

log = logging.getLogger("smelt.lowering")

_SDPA = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
_MASK_POSITION = 3  # scaled_dot_product_attention(query, key, value, attn_mask, ...)


def dense_attention_masks(gm: torch.fx.GraphModule, devices=("cuda",)) -> int:
    """Gives each SDPA call on `devices` whose mask (additive or boolean) has a strided last
    dimension a contiguous copy of it instead. Returns how many it changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        mask = node.kwargs.get("attn_mask", node.args[_MASK_POSITION] if len(node.args) > _MASK_POSITION else None)
        value = mask.meta.get("example_value") if isinstance(mask, torch.fx.Node) else None
        if not (isinstance(value, torch.Tensor) and value.device.type in devices and value.dim() >= 1
                and value.shape[-1] > 1 and value.stride(-1) != 1):
            continue
        if written_in_place(node):  # the fused kernel would save the output the program writes
            log.debug("smelt: SDPA at %s keeps its strided mask: its output is written in place", node.name)
            continue
        with gm.graph.inserting_before(node):
            dense = gm.graph.call_method("contiguous", (mask,))
        dense.meta["example_value"] = value.contiguous()
        if "attn_mask" in node.kwargs:
            node.update_kwarg("attn_mask", dense)
        else:
            node.update_arg(_MASK_POSITION, dense)
        changed += 1
    if changed:
        gm.recompile()
    return changed
