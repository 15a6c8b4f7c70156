"""Reductions and scans over the r axis of whole [X, R] tensors, with eager's semantics: NaN wins
max, min and their arguments (the first index among ties), an empty row gives the identity."""
from __future__ import annotations

import torch

from ...ir import use_handler
from ...ir.reduction_kinds import reduction_identity
from ..common import register_dtype, scan_register_dtype


def _extreme(rtype: str, v: torch.Tensor) -> torch.Tensor:
    if v.shape[1] == 0:
        return torch.full((v.shape[0], 1), reduction_identity(rtype, v.dtype), dtype=v.dtype, device=v.device)
    wide = v.to(torch.uint8) if v.dtype == torch.bool else v
    return (torch.amax if rtype == "max" else torch.amin)(wide, 1, keepdim=True).to(v.dtype)


def _arg_extreme(rtype: str, v: torch.Tensor) -> torch.Tensor:
    if v.shape[1] == 0:
        return torch.zeros((v.shape[0], 1), dtype=torch.int64, device=v.device)
    wide = v.to(torch.uint8) if v.dtype == torch.bool else v
    return (torch.argmax if rtype == "argmax" else torch.argmin)(wide, 1, keepdim=True)


def _welford(v: torch.Tensor, reg: torch.dtype) -> tuple:
    """In float64, then rounded: at least as exact as eager's Welford. Each row is shifted by its
    first value (0 where not finite), as Welford starts from it: equal values have m2 exactly 0."""
    wide = v.to(torch.float64)
    first = wide[:, :1] if v.shape[1] else torch.zeros((v.shape[0], 1), dtype=torch.float64, device=v.device)
    shift = torch.where(torch.isfinite(first), first, torch.zeros_like(first))
    d = wide - shift
    offset = d.mean(1, keepdim=True)
    m2 = ((d - offset) ** 2).sum(1, keepdim=True)
    count = torch.full_like(offset, v.shape[1])
    return tuple(t.to(reg) for t in (shift + offset, m2, count))


def _welford_combine(parts: list, reg: torch.dtype) -> tuple:
    mean, m2, count = (p.to(torch.float64) for p in parts)
    total = count.sum(1, keepdim=True)
    weighted = (count * mean).sum(1, keepdim=True)
    merged = torch.where(total > 0, weighted / total, torch.zeros_like(total))
    spread = (m2 + count * (mean - merged) ** 2).sum(1, keepdim=True)
    return tuple(t.to(reg) for t in (merged, spread, total))


def _online_softmax(v: torch.Tensor) -> tuple:
    top = _extreme("max", v)
    return top, torch.exp(v - top).sum(1, keepdim=True)


def reduce(run, node, value) -> torch.Tensor:
    """One output of node's reduction of `value` (the body's result, per (x, r)) over r."""
    rtype, src = node.data.reduction_type, node.data.src_dtype
    reg = register_dtype(src)
    shape = run.shape
    if rtype == "welford_combine":
        parts = [run.handler.to_dtype(v, src).broadcast_to(shape) for v in value]
        return _welford_combine(parts, reg)[node.data.output_index]
    v = run.handler.to_dtype(value, src).broadcast_to(shape)
    if rtype == "sum":
        results = (v.sum(1, keepdim=True, dtype=v.dtype),)
    elif rtype == "prod":
        results = (v.prod(1, keepdim=True, dtype=v.dtype),)
    elif rtype in ("max", "min"):
        results = (_extreme(rtype, v),)
    elif rtype in ("argmax", "argmin"):
        results = (_arg_extreme(rtype, v),)
    elif rtype == "any":
        results = ((v != 0).any(1, keepdim=True),)
    elif rtype == "all":
        results = ((v != 0).all(1, keepdim=True),)
    elif rtype == "welford_reduce":
        results = _welford(v, reg)
    elif rtype == "online_softmax_reduce":
        results = _online_softmax(v)
    else:
        raise NotImplementedError(f"smelt: reduction {rtype} in the reference backend")
    return results[node.data.output_index]


def scan(run, node, values) -> torch.Tensor:
    """node's inclusive scan along r by its own combine, in log2(R) steps: after the step of
    width w, each element holds the combine of the w * 2 elements ending at it (associativity is
    all the combines promise, and all this grouping needs)."""
    data = node.data
    dtypes = [scan_register_dtype(d) for d in data.dtypes]
    columns = [run.handler.to_dtype(v, d).to(r).broadcast_to(run.shape)
               for v, d, r in zip(values, data.dtypes, dtypes)]
    width = 1
    while width < run.shape[1]:
        earlier = tuple(c[:, :-width] for c in columns)
        later = tuple(c[:, width:] for c in columns)
        with use_handler(run.handler):
            combined = data.combine.fn(earlier, later)
        columns = [torch.cat([c[:, :width], v.to(r).broadcast_to(l.shape)], 1)
                   for c, v, r, l in zip(columns, combined, dtypes, later)]
        width *= 2
    return run.handler.to_dtype(columns[data.output_index], data.dtype)
