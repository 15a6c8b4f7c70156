"""Scans printed in Halide: an inclusive prefix combine along r, one row per x.

The scan is a Func over (r, x): its pure definition is each element's own value, and its update
walks r from 1 in order, combining the running result at r - 1 with the element at r. The
combine is the scan's own loop body, printed by HalideOps with the two sides as Func calls.

On the CPU, a scan of one value along rows of a static length is blocked instead (`_blocked`):
prefixes within blocks of BLOCK elements in log2(BLOCK) steps, each a vector op across the row,
then a serial scan of the blocks' totals, then each block combined with the total before it.
Every scan smelt lowers (cumsum, cumprod, cummax, logcumsumexp, associative_scan) combines
associatively, so only the grouping of the combines changes, not the result beyond rounding.
"""
from __future__ import annotations

import contextlib

from ...ir import use_handler
from ..common import CSEVar, scan_register_dtype
from .ops import func_call, halide_type


def emit_scan(k, node, values) -> CSEVar:
    """Prints node's scan (once for every member scanning the same values) and returns its value
    as a call at (r, x), in the node's dtype."""
    data = node.data
    ops = k.ops()
    dtypes = [scan_register_dtype(d) for d in data.dtypes]
    values = tuple(ops.to_dtype(v, d) for v, d in zip(values, data.dtypes))
    values = tuple(ops.to_dtype(v, d) if d != v.dtype else v for v, d in zip(values, dtypes))
    key = (data.combine.name, tuple(v.name for v in values))
    if key not in k.scan_results and _blockable(k, dtypes):
        k.scan_results[key] = (_blocked(k, ops, data, f"{node.name}_scan", values[0], dtypes[0]),)
    if key not in k.scan_results:
        name = f"{node.name}_scan"
        k.body.writeline(f'{name}_input = hl.Func("{name}_input")')
        k.body.writeline(f"{name}_input[r, x] = {_tuple(_typed(v, d) for v, d in zip(values, dtypes))}")
        k.body.writeline(f'{name} = hl.Func("{name}")')
        k.body.writeline(f"{name}[r, x] = {name}_input[r, x]")
        k.body.writeline(f'{name}_steps = hl.RDom([(1, hl.max(rnumel - 1, 0))], "{name}_steps")')
        step = f"{name}_steps.x"
        earlier = tuple(CSEVar(_element(f"{name}[{step} - 1, x]", i, len(dtypes)), d, 2) for i, d in enumerate(dtypes))
        later = tuple(CSEVar(_element(f"{name}_input[{step}, x]", i, len(dtypes)), d, 2) for i, d in enumerate(dtypes))
        with k.cse.scope(), use_handler(ops), _in_update(k):
            combined = data.combine.fn(earlier, later)
            combined = [_typed(ops.to_dtype(v, d), d) for v, d in zip(combined, dtypes)]
        k.body.writeline(f"{name}[{step}, x] = {_tuple(combined)}")
        k.schedule.scan(name)
        k.scan_results[key] = tuple(CSEVar(_element(f"{name}[r, x]", i, len(dtypes)), d, 2)
                                    for i, d in enumerate(dtypes))
    return ops.to_dtype(k.scan_results[key][data.output_index], data.dtype)


# Elements a block's prefix covers: a vector of float32 on AVX-512.
BLOCK = 16


def _blockable(k, dtypes) -> bool:
    """A scan of one value along contiguous rows of a static length, on the CPU (a column scan
    keeps the serial form, which runs neighbouring rows side by side as vector lanes)."""
    rnumel = k.plan.static_sizes()[1]
    return (k.schedule.device == "cpu" and len(dtypes) == 1 and rnumel is not None and rnumel >= 2 * BLOCK
            and k.plan.r_contiguous())


def _combine(k, ops, data, dtype, earlier: str, later: str) -> str:
    """The scan's combine of two Func calls, as an Expr of dtype."""
    with k.cse.scope(), use_handler(ops):
        combined = data.combine.fn((CSEVar(func_call(earlier), dtype, 2),), (CSEVar(func_call(later), dtype, 2),))
        return _typed(ops.to_dtype(combined[0], dtype), dtype)


def _blocked(k, ops, data, name: str, value: CSEVar, dtype) -> CSEVar:
    """The blocked scan of value along r (see the module's docstring); returns its call at (r, x).
    (2048x2048 float32 cumsum's kernel, one thread: 3.9 ms serial along r with eight rows side by
    side, 2.8 ms blocked; `benchmarks/probes/halide_ab.py`.)"""
    stage = f"{name}_in_block0"
    k.body.writeline(f'{stage} = hl.Func("{stage}")')
    k.body.writeline(f"{stage}[r, x] = {_typed(value, dtype)}")
    stages = [stage]
    step = 1
    while step < BLOCK:
        previous, stage = stage, f"{name}_in_block{step.bit_length()}"
        # Lanes below `step` within their block have nothing that far back in it; the index is
        # clamped so that bounds inference never reaches before the row.
        both = _combine(k, ops, data, dtype, f"{previous}[hl.max(r - {step}, 0), x]", f"{previous}[r, x]")
        k.body.writeline(f'{stage} = hl.Func("{stage}")')
        k.body.writeline(f"{stage}[r, x] = hl.select(r % {BLOCK} >= {step}, {both}, {previous}[r, x])")
        stages.append(stage)
        step *= 2
    blocks = f"{name}_blocks"
    k.body.writeline(f'{blocks} = hl.Func("{blocks}")')
    k.body.writeline(f"{blocks}[r, x] = {stage}[hl.min(r * {BLOCK} + {BLOCK - 1}, rnumel - 1), x]")
    k.body.writeline(f'{blocks}_steps = hl.RDom([(1, (rnumel - 1) // {BLOCK})], "{blocks}_steps")')
    with _in_update(k):
        walked = _combine(k, ops, data, dtype, f"{blocks}[{blocks}_steps.x - 1, x]", f"{blocks}[{blocks}_steps.x, x]")
    k.body.writeline(f"{blocks}[{blocks}_steps.x, x] = {walked}")
    both = _combine(k, ops, data, dtype, f"{blocks}[hl.max(r // {BLOCK} - 1, 0), x]", f"{stage}[r, x]")
    k.body.writeline(f'{name} = hl.Func("{name}")')
    k.body.writeline(f"{name}[r, x] = hl.select(r >= {BLOCK}, {both}, {stage}[r, x])")
    k.schedule.blocked_scan(stages, blocks)
    return CSEVar(func_call(f"{name}[r, x]"), dtype, 2)


@contextlib.contextmanager
def _in_update(k):
    """Printing an update over an RDom: logcumsumexp's exp fell back to Triton's interpreter for every
    Halide scan ("Reduction domain referenced in pure function definition": exp_float32's Func)."""
    k.in_update = True
    try:
        yield
    finally:
        k.in_update = False


def _typed(value: CSEVar, dtype) -> str:
    """value as an Expr of dtype's Halide type (a literal or an index may print as another)."""
    return f"hl.cast({halide_type(dtype)}, {value.name})"


def _tuple(values) -> str:
    """A Func's value: one Expr, or a Tuple of several (a one-element Tuple is no Tuple to Halide)."""
    values = list(values)
    return values[0] if len(values) == 1 else f"({', '.join(values)})"


def _element(call: str, i: int, count: int) -> str:
    return func_call(call if count == 1 else f"{call}[{i}]")
