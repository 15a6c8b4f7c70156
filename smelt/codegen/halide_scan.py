"""Scans printed in Halide: an inclusive prefix combine along r, one row per x.

The scan is a Func over (r, x): its pure definition is each element's own value, and its update
walks r from 1 in order, combining the running result at r - 1 with the element at r. The
combine is the scan's own loop body, printed by HalideOps with the two sides as Func calls.
"""
from __future__ import annotations

from .common import CSEVar
from .halide_ops import func_call, halide_type
from .triton_scan import scan_register_dtype


def emit_scan(k, node, values) -> CSEVar:
    """Prints node's scan (once for every member scanning the same values) and returns its value
    as a call at (r, x), in the node's dtype."""
    from .halide import HalideOps
    from ..ir import use_handler
    data = node.data
    ops = HalideOps(k)
    dtypes = [scan_register_dtype(d) for d in data.dtypes]
    values = tuple(ops.to_dtype(v, d) for v, d in zip(values, data.dtypes))
    values = tuple(ops.to_dtype(v, d) if d != v.dtype else v for v, d in zip(values, dtypes))
    key = (data.combine.name, tuple(v.name for v in values))
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
        with k.cse.scope(), use_handler(ops):
            combined = data.combine.fn(earlier, later)
            combined = [_typed(ops.to_dtype(v, d), d) for v, d in zip(combined, dtypes)]
        k.body.writeline(f"{name}[{step}, x] = {_tuple(combined)}")
        k.schedule.scan(name)
        k.scan_results[key] = tuple(CSEVar(_element(f"{name}[r, x]", i, len(dtypes)), d, 2)
                                    for i, d in enumerate(dtypes))
    return ops.to_dtype(k.scan_results[key][data.output_index], data.dtype)


def _typed(value: CSEVar, dtype) -> str:
    """value as an Expr of dtype's Halide type (a literal or an index may print as another)."""
    return f"hl.cast({halide_type(dtype)}, {value.name})"


def _tuple(values) -> str:
    """A Func's value: one Expr, or a Tuple of several (a one-element Tuple is no Tuple to Halide)."""
    values = list(values)
    return values[0] if len(values) == 1 else f"({', '.join(values)})"


def _element(call: str, i: int, count: int) -> str:
    return func_call(call if count == 1 else f"{call}[{i}]")
