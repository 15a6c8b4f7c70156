"""What every backend's kernel does with a kernel plan, whatever it makes of a loop body: the
members' bodies run under the backend's ops handler, at each member's own index; a member's value
reaches the fused members that read it without a load; a reduction is computed once.

`KernelBody` is the walk (the reference backend runs it on tensors); `PrintedKernel` adds what a
kernel printed as source shares (Triton's and Halide's): CSE'd temporaries in a body of text,
reductions memoized by their inputs, a member printed then stored.
"""
from __future__ import annotations

import contextlib

import sympy
import torch

from ..ir import use_handler
from ..scheduler.nodes import RINDEX, XINDEX
from ..scheduler.placement import Placement
from ..symbolic import simplify_index
from .common import CSE, CSEVar, IndentedBuffer


class KernelBody:
    """A kernel plan's members, evaluated under a backend's ops handler (`ops()`)."""

    def __init__(self, plan):
        self.plan = plan
        self.node_values: dict = {}  # member name -> its value, once computed where all readers see it
        self.current: list = []  # members whose bodies are running, innermost last
        self.mask_stack: list = []  # masks of the masked() regions the running body is inside

    def ops(self):
        """The backend's ops handler over this kernel."""
        raise NotImplementedError

    def compute(self, node):
        """The member's value: its body run (`body_value`), then made what its placement needs."""
        raise NotImplementedError

    def value_of(self, node):
        if node.name in self.node_values:
            return self.node_values[node.name]
        return self.compute(node)

    def fused_value(self, buffer: str):
        """The value of the member of this kernel that writes `buffer`, where the member reading it
        comes later (a load reads it from there, not from memory); None: a load from memory."""
        writer = self.plan.writer_of(buffer)
        reader = self.current[-1] if self.current else None
        if writer is not None and (reader is None or writer.position < reader.position):
            return self.value_of(writer)
        return None

    def member_index(self, node) -> tuple[list, list | None]:
        """The member's index (and reduction index) in the kernel's xindex and rindex."""
        return node.kernel_index(self.plan.placement[node.name], self.plan.xnumel, self.plan.rnumel)

    @contextlib.contextmanager
    def running(self, node):
        """While code of member `node` runs under the backend's ops. A reader under masked() may
        ask for the member's value: the member is computed at its own index, which the reader's
        masks do not guard (a scan run under them summed only the unmasked elements)."""
        self.current.append(node)
        reader_masks, self.mask_stack = self.mask_stack, []
        try:
            with use_handler(self.ops()):
                yield
        finally:
            self.current.pop()
            self.mask_stack = reader_masks

    def body_value(self, node):
        """The member's loop body at its own index, under the backend's ops."""
        index, rindex = self.member_index(node)
        with self.running(node):
            if self.plan.placement[node.name] == Placement.REDUCTION:
                return node.data.inner_fn(index, rindex)
            return node.data.inner_fn(index)

    def simplify(self, expr) -> sympy.Expr:
        return simplify_index(sympy.sympify(expr), {XINDEX: self.plan.xnumel, RINDEX: self.plan.rnumel})

    def scatter_offset(self, node) -> sympy.Expr:
        """The element a scatter member writes for the current lanes: its position expressions run
        under the backend's ops (they may load index tensors), then go through the target's layout."""
        index, _ = self.member_index(node)
        with self.running(node):
            position = node.data.output_index(index)
        return self.simplify(node.buffer.layout.index(position))


class PrintedKernel(KernelBody):
    """A kernel printed as source: temporaries CSE'd into `body`, one line each."""

    def __init__(self, plan, graph):
        super().__init__(plan)
        self.graph = graph
        self.cse = CSE()
        self.body = IndentedBuffer(1)
        self.reduction_results: dict[tuple, tuple[CSEVar, ...]] = {}

    def emit(self, expr: str, dtype: torch.dtype, rank: int) -> CSEVar:
        return self.cse.generate(self.body, expr, dtype, rank)

    def reduction(self, node, value) -> CSEVar:
        """The member's reduction result; reductions of the same kind over the same values (a
        var_mean's two outputs, a softmax's max read twice) are printed once."""
        rtype = node.data.reduction_type
        key = (rtype, tuple(v.name for v in value) if isinstance(value, tuple) else value.name)
        if key not in self.reduction_results:
            self.reduction_results[key] = self.print_reduction(node, rtype, value)
        return self.reduction_results[key][node.data.output_index]

    def print_reduction(self, node, rtype: str, value) -> tuple[CSEVar, ...]:
        """Every result of reduction `rtype` over value."""
        raise NotImplementedError

    def store(self, node, value: CSEVar) -> None:
        raise NotImplementedError

    def emit_scatter(self, node) -> None:
        raise NotImplementedError

    def emit_member(self, node) -> None:
        if node.is_scatter:
            return self.emit_scatter(node)
        self.describe_member(node)
        value = self.compute(node)
        if node.write_name in self.plan.stored:
            self.store(node, value)

    def describe_member(self, node) -> None:
        """A comment before the member's lines, where the backend prints one."""
