"""What the scheduler knows about each buffer: how it iterates, what it reads and writes."""
from __future__ import annotations

import re

import sympy

from ..ir import ComputedBuffer, MultiOutput, Reduction, Scan, Scatter, use_handler
from ..ir.ops import ReadsHandler
from ..symbolic import Expr, dense_dim_order, index_var, product, simplify_index, static_ints, unflatten_index
from .placement import Placement

_NAME = re.compile(r"\b[a-z]+\d+\b")

XINDEX = index_var("xindex")
RINDEX = index_var("rindex")


def same(a: Expr, b: Expr) -> bool:
    return sympy.expand(a - b) == 0


class SchedulerNode:
    """One buffer-producing step: a loop nest (ComputedBuffer) or an ATen call (ExternKernel)."""

    def __init__(self, buffer, position: int):
        self.buffer = buffer
        self.position = position
        self.name = buffer.name
        self.is_extern = not isinstance(buffer, ComputedBuffer)
        self.reads: list[tuple[str, Expr]] = []
        if self.is_extern:
            inputs = buffer.parent.inputs() if isinstance(buffer, MultiOutput) else buffer.inputs()
            self.read_names = {i.storage_name for i in inputs}
            if isinstance(buffer, MultiOutput):
                self.read_names = {buffer.parent.name}
        else:
            self.reads = self._trace_reads()
            self.read_names = {name for name, _ in self.reads}
        self.write_name = buffer.storage_name if isinstance(buffer, ComputedBuffer) else buffer.name
        # The SharedStorage this node's buffer is a slice of: its readers wait for this node too.
        self.fills: str | None = buffer.lives_in[0] if buffer.lives_in else None
        if self.is_scatter:
            # A scatter updates what its target holds: it runs after the target's writer.
            self.read_names.add(self.write_name)
        # Fusion checks, planning and codegen ask for the same placements again and again, and
        # each answer costs sympy simplification: computed once per (placement, xnumel, rnumel).
        self._memo: dict = {}

    def _cached(self, what: str, placement: Placement, xnumel, rnumel, compute):
        key = (what, placement, xnumel, rnumel)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def mentioned_symbols(self) -> set[str]:
        """Names of the size symbols this step's shapes, indices, bodies or arguments use."""
        if "symbols" not in self._memo:
            found = set()
            layout = self.buffer.layout
            if layout is not None:
                for e in (*layout.size, *layout.stride, layout.offset):
                    found |= sympy.sympify(e).free_symbols
            if self.is_extern:
                found |= _symbols_in_args(self.buffer.args, self.buffer.kwargs)
                if self.buffer.condition is not None:
                    found |= self.buffer.condition.free_symbols
            else:
                data = self.data
                for e in (*data.ranges, *data.reduction_ranges):
                    found |= sympy.sympify(e).free_symbols
                for _, index in self.reads:
                    found |= index.free_symbols
                # Symbols used as values (ops.index_expr) show only in the body's text.
                found |= set(_NAME.findall(data.body_text()))
            self._memo["symbols"] = {str(s) for s in found}
        return self._memo["symbols"]

    @property
    def data(self):
        return self.buffer.data

    @property
    def is_reduction(self) -> bool:
        return not self.is_extern and isinstance(self.data, Reduction)

    @property
    def is_scatter(self) -> bool:
        return not self.is_extern and isinstance(self.data, Scatter)

    @property
    def is_scan(self) -> bool:
        return not self.is_extern and isinstance(self.data, Scan)

    def _trace_reads(self):
        handler = ReadsHandler()
        with use_handler(handler):
            if isinstance(self.data, Reduction):
                self.data.inner_fn(self.data.index_vars(), self.data.reduction_vars())
            else:
                self.data.inner_fn(self.data.index_vars())
            if isinstance(self.data, Scatter):
                self.data.output_index(self.data.index_vars())
        return handler.reads

    def numel(self) -> Expr:
        """The x extent of a kernel this node leads: a scan runs one program lane per scanned row."""
        return self.data.outer_numel() if self.is_scan else product(self.data.ranges)

    def reduction_numel(self) -> Expr:
        if self.is_scan:
            return self.data.scan_numel()
        return self.data.reduction_numel() if self.is_reduction else sympy.Integer(1)

    # ------------------------------------------------------------ placement in a kernel

    def placement(self, xnumel: Expr, rnumel: Expr) -> Placement | None:
        """How this node runs in a kernel of shape (xnumel, rnumel); None where it cannot be a member."""
        if self.is_extern:
            return None
        if self.is_reduction or self.is_scan:
            ok = same(self.numel(), xnumel) and same(self.reduction_numel(), rnumel)
            return (Placement.SCAN if self.is_scan else Placement.REDUCTION) if ok else None
        if self.is_scatter:  # one element per program lane; never inside a reduction's r loop
            return Placement.X if rnumel == 1 and same(self.numel(), xnumel) else None
        if same(self.numel(), xnumel):
            return Placement.X
        if rnumel != 1 and same(self.numel(), xnumel * rnumel):
            return Placement.XR
        return None

    def kernel_index(self, placement: Placement, xnumel: Expr, rnumel: Expr):
        """This node's index vars (and reduction vars) as expressions of the kernel's xindex/rindex."""
        return self._cached("index", placement, xnumel, rnumel,
                            lambda: self._kernel_index(placement, xnumel, rnumel))

    def _kernel_index(self, placement: Placement, xnumel: Expr, rnumel: Expr):
        ranges = {XINDEX: xnumel, RINDEX: rnumel}
        if placement == Placement.SCAN:  # the scanned dimension runs along r, the others along x
            outer = unflatten_index(XINDEX, self.data.outer_ranges())
            outer.insert(self.data.dim, RINDEX)
            return [simplify_index(e, ranges) for e in outer], None
        flat = XINDEX * rnumel + RINDEX if placement == Placement.XR else XINDEX
        order = self._walk_order(placement, rnumel)
        if order is None:
            index = unflatten_index(flat, self.data.ranges)
        else:
            index = [sympy.Integer(0)] * len(self.data.ranges)
            for d, e in zip(order, unflatten_index(flat, [self.data.ranges[d] for d in order])):
                index[d] = e
        index = [simplify_index(e, ranges) for e in index]
        if placement == Placement.REDUCTION:
            rindex = [simplify_index(e, ranges) for e in unflatten_index(RINDEX, self.data.reduction_ranges)]
            return index, rindex
        return index, None

    def _walk_order(self, placement: Placement, rnumel: Expr) -> list[int] | None:
        """The dim order this node's flat index walks, when not row-major: its memory order for
        an x member, and for an xr member whose r spans whole innermost dims of that order (a
        channels-last tile of rows of C, a sum over C); else None (an xr member of a reduction
        over H*W of a channels-last buffer reads it as the reduction does, in logical order)."""
        order = self._memory_order()
        if order is None or placement == Placement.X:
            return order
        if placement != Placement.XR:
            return None
        inner = sympy.Integer(1)
        for d in reversed(order):
            inner = inner * self.data.ranges[d]
            if same(inner, rnumel):
                return order
        return None

    def memory_order_splits(self) -> list[Expr]:
        """Element counts of each run of innermost dims in memory order (tile splits that walk
        memory in order), for a buffer laid out in a permuted order; [] otherwise."""
        order = self._memory_order()
        if order is None:
            return []
        sizes, inner = [], sympy.Integer(1)
        for d in reversed(order[1:]):
            inner = inner * self.data.ranges[d]
            sizes.append(inner)
        return sizes

    def _memory_order(self) -> list[int] | None:
        """The dims of a pointwise buffer laid out in a permuted order (a channels-last activation),
        outermost first, so that its kernel walks memory in order; None for row-major ones."""
        if self.is_reduction or self.is_scan or self.is_scatter:
            return None
        layout = self.buffer.layout
        if layout is None:
            return None
        size, stride = static_ints(layout.size), static_ints(layout.stride)
        if size is None or stride is None or size != static_ints(self.data.ranges):
            return None
        order = dense_dim_order(size, stride)
        return None if order is None or order == sorted(order) else order

    def store_index(self, placement: Placement, xnumel: Expr, rnumel: Expr) -> Expr:
        def compute():
            index, _ = self.kernel_index(placement, xnumel, rnumel)
            if self.is_scatter:
                with use_handler(ReadsHandler()):  # loads the positions; indirect ones become symbols
                    index = self.data.output_index(index)
            return simplify_index(self.buffer.layout.index(index), {XINDEX: xnumel, RINDEX: rnumel})
        return self._cached("store", placement, xnumel, rnumel, compute)

    def reads_in_kernel(self, placement: Placement, xnumel: Expr, rnumel: Expr) -> list[tuple[str, Expr]]:
        """Every (buffer, index) this node loads, the index written in the kernel's xindex/rindex."""
        return self._cached("reads", placement, xnumel, rnumel,
                            lambda: self._reads_in_kernel(placement, xnumel, rnumel))

    def _reads_in_kernel(self, placement: Placement, xnumel: Expr, rnumel: Expr):
        index, rindex = self.kernel_index(placement, xnumel, rnumel)
        subs = dict(zip(self.data.index_vars(), index))
        if rindex is not None:
            subs.update(zip(self.data.reduction_vars(), rindex))
        ranges = {XINDEX: xnumel, RINDEX: rnumel}
        return [(name, simplify_index(sympy.sympify(e).xreplace(subs), ranges)) for name, e in self.reads]

    def __repr__(self):
        return f"SchedulerNode({self.name})"


def _symbols_in_args(args, kwargs) -> set:
    found = set()

    def visit(a):
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, sympy.Basic):
            found.update(a.free_symbols)
    visit(args)
    visit(tuple(kwargs.values()))
    return found
