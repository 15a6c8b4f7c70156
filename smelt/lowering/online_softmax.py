"""Softmax's row statistics in one pass over the row.

The softmax family (softmax, log_softmax, cross entropy, hand-written logsumexp-like code) reaches
smelt as

    m = amax(v, dims, keepdim=True);  s = sum(exp(v - m), dims)

Lowered as written these are two reductions, and where a row does not fit in registers each is
its own loop over the row: v is read once for m and once more for s. Here the pair becomes one
reduction with two outputs ("online_softmax_reduce": 0 is m, 1 is s): the kernel keeps a running
max per lane and rescales the lane's running sum whenever that max grows, so both statistics
come out of one loop.

The elementwise steps of such a row (v itself when it is elementwise, as the float32 upcast of a
half-float input is, v - m, and what is computed from them elementwise) are recomputed by every
reader instead of being stored. A reader in another kernel, such as cross entropy's gather of one
logit per row, would otherwise force a whole rows x row-length intermediate to memory only to read
one element of each row back.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx

from ..ir import Pointwise, StorageBox, TensorBox, ops
from ..ir.ops import ReadsHandler, use_handler
from ..symbolic import product
from .views import drop_size_one_dims
from ..ir.graph import origin_name
from .common import make_pointwise, traced_value
from .reductions import accumulator_dtype, make_reduction

aten = torch.ops.aten

# The running rescale is only worth its exactness argument in the accumulator's own precision:
# a half-float v - m is rounded by eager, and matching that is not this rewrite's job.
_FLOAT_TYPES = (torch.float32, torch.float64)
# A row step recomputed by its readers loads at most this many values per element.
RECOMPUTE_MAX_LOADS = 4



def _dtype(node):
    return getattr(traced_value(node), "dtype", None)


def _argument(node: torch.fx.Node, position: int, name: str, default):
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _reduced_dims(dims, ndim: int) -> frozenset[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return frozenset(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    return frozenset(d + ndim if d < 0 else d for d in dims)


def _is_elementwise(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target is aten._to_copy.default:
        return set(node.kwargs) <= {"dtype"}  # a plain dtype conversion
    return torch.Tag.pointwise in node.target.tags and not node.target.is_view


@dataclasses.dataclass
class _Row:
    """One matched amax and the sums that read it; the IR is filled in when amax is lowered."""

    dims: frozenset[int]
    sums: list[torch.fx.Node]  # sum(exp(v - m), dims)
    log_softmax_sums: list[torch.fx.Node]  # sum(v - m - log(s), dims), maybe of a dtype cast of it
    values: TensorBox | None = None  # v
    row_max: TensorBox | None = None
    row_sum: TensorBox | None = None


class SoftmaxRows:
    """The amax/sum pairs of one FX graph that become one online reduction, found before lowering.

    `amax` lowers both statistics when it meets a matched node (`lower_statistics`); each matched
    sum then takes its result from `sum_result` instead of reducing again.
    """

    def __init__(self, gm: torch.fx.GraphModule):
        self.rows: dict[torch.fx.Node, _Row] = {}  # by amax node
        self.row_of_sum: dict[torch.fx.Node, _Row] = {}
        self.recomputed: set[torch.fx.Node] = set()  # row steps every reader recomputes
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is aten.amax.default:
                self._match(node)

    def _match(self, amax: torch.fx.Node) -> None:
        v = amax.args[0]
        meta = traced_value(amax)
        if not isinstance(traced_value(v), torch.Tensor) or not isinstance(meta, torch.Tensor) or meta.dtype not in _FLOAT_TYPES:
            return
        if not _argument(amax, 2, "keepdim", False) or meta.dim() == 0:
            return
        ndim = meta.dim()
        dims = _reduced_dims(_argument(amax, 1, "dim", []), ndim)

        def sums_over_row(node):
            return [total for total in node.users
                    if total.target is aten.sum.dim_IntList and total.args[0] is node
                    and _argument(total, 3, "dtype", None) is None
                    and _reduced_dims(_argument(total, 1, "dim", None), ndim) == dims]

        shifts = [shift for shift in amax.users
                  if shift.target is aten.sub.Tensor and shift.args == (v, amax) and not shift.kwargs
                  and _dtype(shift) == meta.dtype]
        sums = [total for shift in shifts for exp in shift.users if exp.target is aten.exp.default
                and _dtype(exp) == meta.dtype for total in sums_over_row(exp) if _dtype(total) == meta.dtype]
        if not sums:
            return
        # log_softmax = (v - m) - log(s); label-smoothed cross entropy sums it over the row.
        log_softmax_sums = []
        for shift in shifts:
            for out in shift.users:
                if out.target is aten.sub.Tensor and not out.kwargs and out.args[0] is shift \
                        and getattr(out.args[1], "target", None) is aten.log.default and out.args[1].args[0] in sums:
                    # A float cast rounds each term, so rounding the total instead is a rounding
                    # change; an integer or bool cast truncates each term, which the total cannot.
                    casts = [c for c in out.users if c.target is aten._to_copy.default and _is_elementwise(c)
                             and isinstance(c.kwargs.get("dtype"), torch.dtype) and c.kwargs["dtype"].is_floating_point]
                    log_softmax_sums += [t for node in [out] + casts for t in sums_over_row(node)]
        row = _Row(dims, sums, log_softmax_sums)
        self.rows[amax] = row
        for total in sums + log_softmax_sums:
            self.row_of_sum[total] = row
        self.recomputed |= _row_steps(v, shifts)

    # ------------------------------------------------------------ lowering

    def lower_statistics(self, g, x: TensorBox, dims) -> TensorBox | None:
        """amax's result when g.node is a matched amax: the max of the online reduction, whose sum
        output is kept for the matched sums. None when the node is not matched."""
        row = self.rows.get(g.node)
        if row is None or x.get_dtype() not in _FLOAT_TYPES:
            return None
        origins = g.origin | frozenset(origin_name(s) for s in row.sums)
        dtype = x.get_dtype()
        row.values = x
        row.row_max, row.row_sum = make_reduction(g, x, dims, True, "online_softmax_reduce", dtype, dtype,
                                                  outputs=(0, 1), origins=origins)
        return row.row_max

    def sum_result(self, g) -> TensorBox | None:
        """A matched sum's value, shaped as eager's result, or None for any other sum."""
        row = self.row_of_sum.get(g.node)
        if row is None or row.row_sum is None:
            return None
        keepdim = _argument(g.node, 2, "keepdim", False)
        if g.node in row.sums:
            return row.row_sum if keepdim else drop_size_one_dims(row.row_sum, row.dims)
        return self._log_softmax_sum(g, row, keepdim)

    def _log_softmax_sum(self, g, row: _Row, keepdim: bool) -> TensorBox:
        """sum(v - m - log(s)) over the row as sum(v) - n * (m + log(s)): sum(v) joins the pass
        that computes m and s, where summing the log-softmax itself would need m and s first and so
        a second pass. The terms eager adds are each rounded (to its dtype, and to a half-float
        when cast); here only the total is. For logits far from zero (|v| much larger than
        m + log(s) - v) the subtraction of two large totals costs digits that eager's sum of
        small terms keeps, which is well inside float32 tolerances for logits of common size."""
        acc = accumulator_dtype(row.values.get_dtype())
        total = make_reduction(g, row.values, sorted(row.dims), True, "sum", acc, acc)
        size = total.get_size()
        count = product(row.values.get_size()[d] for d in row.dims)

        def minus_statistics(t, m, s, n):
            return ops.sub(t, ops.mul(n, ops.add(m, ops.log(s))))
        result = make_pointwise(g, [total, row.row_max, row.row_sum, count], minus_statistics, compute_dtype=acc,
                                out_dtype=g.out_meta.dtype, size=size)
        return result if keepdim else drop_size_one_dims(result, row.dims)

    def keeps_inline(self, node: torch.fx.Node, value) -> bool:
        """Whether a value with several readers is left for each of them to recompute."""
        if node not in self.recomputed or not isinstance(value, TensorBox) or not isinstance(value.data, StorageBox):
            return False
        loops = value.data.data
        if type(loops) is not Pointwise:
            return False
        handler = ReadsHandler()
        with use_handler(handler):
            loops.inner_fn(loops.index_vars())
        return len(handler.reads) <= RECOMPUTE_MAX_LOADS


def _row_steps(v: torch.fx.Node, shifts: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """v (when elementwise), the shifts v - m and every elementwise node of the row's shape
    computed from them."""
    shape = traced_value(v).shape
    steps = set(shifts)
    if _is_elementwise(v):
        steps.add(v)
    frontier = list(shifts)
    while frontier:
        node = frontier.pop()
        for user in node.users:
            meta = traced_value(user)
            if user not in steps and _is_elementwise(user) and isinstance(meta, torch.Tensor) and meta.shape == shape:
                steps.add(user)
                frontier.append(user)
    return steps
