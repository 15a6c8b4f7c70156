"""Which float32 divisions and square roots eager rounds to a half float before anyone reads them.

A bfloat16 model's batch norm, SiLU, hard-swish and softmax compute in float32 and round the result
to bfloat16 (8 bits of mantissa) or float16 (11). A float32 quotient a few ulps off (the GPU's
div.full.f32 is within 2 ulp of the true one) then rounds to the same half float as the correctly
rounded quotient but where the true value lies within those ulps of a half float's rounding
boundary (a bfloat16 ulp spans 2**16 float32 ulps: about 1 value in 16,000), and there one
half-float ulp away, a tie either way; tests/gpu/test_cuda_dtypes.py counts them against eager. The correctly rounded forms cost EfficientNet-B0 on the H200 0.24 ms of
1.70 (benchmarks/probes/division_precision.py): its norms and SiLUs are bound by their arithmetic.

So such a value may be computed approximately (ops.approx_truediv, ops.approx_sqrt) when every path
from it reaches a half float through ops under which a few float32 ulps stay a few ulps (sums,
products, quotients, roots, exp, clamps, views, casts) and nothing else: not a graph output, a
comparison, a floor, a reduction (a sum can cancel), an integer cast. Float32 and float64 programs
keep eager's correctly rounded results.
"""
from __future__ import annotations

import torch
import torch.fx

from .common import traced_value

aten = torch.ops.aten
prims = torch.ops.prims

HALF_FLOATS = (torch.bfloat16, torch.float16)

# Ops through which an error of a few float32 ulps in an operand stays a few ulps of the result's
# operands; their half-float results are rounded where eager rounds them (smelt rounds each op's
# half result, as eager does).
_SMOOTH = {
    aten.add, aten.sub, aten.mul, aten.div, aten.neg, aten.reciprocal, aten.sqrt, aten.rsqrt, aten.exp,
    aten.sigmoid, aten.silu, aten.tanh, aten.clamp, aten.clamp_min, aten.clamp_max, aten.relu,
    aten.hardtanh, aten._to_copy, aten.clone, aten.alias, aten.view, aten._unsafe_view, aten.reshape,
    aten.unsqueeze, aten.squeeze, aten.expand, aten.permute, aten.transpose, aten.t,
    prims.convert_element_type, prims.mul, prims.add, prims.sub, prims.div,
}
_DEPTH = 12  # ops followed from the value (a batch norm's 1 / sqrt(var + eps) reaches its cast in 8)


def rounded_to_half(node: torch.fx.Node | None, memo: dict) -> bool:
    """Whether eager rounds `node`'s float value to a half float before any other use (see above)."""
    return _rounded(node, memo, _DEPTH)


def _dtype(node) -> torch.dtype | None:
    value = traced_value(node)
    return value.dtype if isinstance(value, torch.Tensor) else None


def _rounded(node, memo: dict, depth: int) -> bool:
    dtype = _dtype(node)
    if dtype in HALF_FLOATS:
        return True
    if dtype != torch.float32 or depth == 0 or not node.users:
        return False
    if node in memo:
        return memo[node]
    answer = all(_smooth(user) and _rounded(user, memo, depth - 1) for user in node.users)
    memo[node] = answer
    return answer


def _smooth(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    packet = getattr(node.target, "overloadpacket", None)
    if packet not in _SMOOTH:
        return False
    return packet is not aten.div or node.kwargs.get("rounding_mode") is None
