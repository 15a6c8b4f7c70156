"""A linear layer's activation applied by the matrix product itself.

A linear layer followed by GELU or ReLU reaches smelt as

    y = addmm(bias, x, w_t);  [views of y];  act(y)

where y is used by nothing else (inference, or a forward pass that does not save it). Lowered as
written, the product writes y and a pointwise kernel reads it back to write act(y). ATen's
`_addmm_activation` applies the activation inside the product's call instead:
- on CUDA, cuBLASLt's epilogue applies it to the float32 accumulator before the one write
  (measured on the H100 with `benchmarks/probes/gemm_epilogue.py`: 1.31x for an 8192x1024x4096 bf16
  product with GELU, 1.39x with ReLU). Its GELU is the tanh form, and only half-float products
  are rewritten: in float32 the product dominates and the GELU epilogue measured no faster (0.99x).
- on the CPU, ATen applies it in place to the product's output while that is still in cache: no
  second buffer, no second pass over memory (`benchmarks/probes/gemm_epilogue.py --cpu`, the CPU mlp row's
  512x512 @ 512x2048: 2-5% faster in two runs, on one thread and on two). Its GELU is the erf
  form, bit for bit eager's `F.gelu(addmm(...))`.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .common import traced_value

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

_HALF_FLOATS = (torch.float16, torch.bfloat16)
# Ops between the product and its activation that change only the shape (a 3-D input's linear).
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def fuse_gemm_epilogues(gm: torch.fx.GraphModule) -> int:
    """Rewrite each eligible addmm -> activation pair of `gm` in place; returns how many."""
    fused = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.relu.default, aten.gelu.default) or not node.args:
            continue
        product = _product_feeding(node.args[0])
        if product is None:
            continue
        use_gelu = _activation(node, traced_value(product).device.type)
        if use_gelu is None:
            continue
        bias, mat1, mat2 = product.args[:3]
        product.target = aten._addmm_activation.default
        product.args = (bias, mat1, mat2)
        product.kwargs = {"use_gelu": use_gelu}
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        log.debug("smelt: %s applied in the epilogue of %s", "gelu" if use_gelu else "relu", product.name)
        fused += 1
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused


# The GELU form `_addmm_activation` computes on each device.
_EPILOGUE_GELU = {"cuda": "tanh", "cpu": "none"}


def _activation(node: torch.fx.Node, device: str) -> bool | None:
    """use_gelu for an activation the epilogue computes exactly as eager does; None otherwise."""
    if node.target is aten.relu.default:
        return False
    approximate = node.args[1] if len(node.args) > 1 else node.kwargs.get("approximate", "none")
    return True if approximate == _EPILOGUE_GELU.get(device) else None


def _product_feeding(value) -> torch.fx.Node | None:
    """The addmm that `value` reshapes, when nothing else reads it or the reshapes in between."""
    while isinstance(value, torch.fx.Node) and value.target in _RESHAPES:
        if len(value.users) != 1:
            return None
        value = value.args[0]
    if not isinstance(value, torch.fx.Node) or value.target is not aten.addmm.default or len(value.users) != 1:
        return None
    if len(value.args) != 3 or any(value.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")):
        return None
    result, bias, mat1, mat2 = (traced_value(n) for n in (value, *value.args))
    if not all(isinstance(t, torch.Tensor) for t in (result, bias, mat1, mat2)):
        return None
    if not (result.device.type == "cpu" and result.dtype.is_floating_point
            or result.device.type == "cuda" and result.dtype in _HALF_FLOATS):
        return None
    # cuBLASLt's bias epilogue adds one value per output column: anything else is not its case.
    if bias.dim() != 1 or bias.dtype != result.dtype:
        return None
    if not (statically_known_true(bias.shape[0] == result.shape[1]) and statically_known_true(bias.stride()[0] == 1)):
        return None
    return value

