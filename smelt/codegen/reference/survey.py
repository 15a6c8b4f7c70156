"""What a kernel's bodies need, found by running them once over symbols before any launch: the
buffers they read from memory, the size symbols the wrapper must pass, and whether an op is one
the reference does not run (random values: smelt's Philox draws are the printed kernels' own)."""
from __future__ import annotations

import sympy

from ...ir import use_handler
from ...ir.ops import TextHandler, is_indirect
from ...scheduler.kernel_plan import KernelPlan, kernel_sizes_symbols
from ...scheduler.nodes import RINDEX, XINDEX
from ...scheduler.placement import Placement
from ..backends import KernelUnsupported


class _Survey(TextHandler):
    def __init__(self):
        super().__init__()
        self.symbols: set = set()

    def _note(self, expr):
        self.symbols |= sympy.sympify(expr).free_symbols

    def load(self, name, index):
        self._note(index)
        return super().load(name, index)

    def index_expr(self, expr, dtype):
        self._note(expr)
        return super().index_expr(expr, dtype)

    def constant(self, value, dtype):
        if isinstance(value, sympy.Basic):
            self._note(value)
        return super().constant(value, dtype)

    def indirect_indexing(self, value, size):
        self._note(size)
        return super().indirect_indexing(value, size)

    def _refuse(self, *args):
        raise KernelUnsupported("smelt: random values (rand, randn, randint64) are not run by the reference backend")

    rand = randn = randint64 = _refuse


def survey(plan: KernelPlan, kept: dict) -> tuple[list[str], list[str]]:
    """(buffers the kernel reads from memory, size symbols it is passed by name)."""
    handler = _Survey()
    inputs = []
    for node in plan.nodes:
        placement = plan.placement[node.name]
        index, rindex = node.kernel_index(placement, plan.xnumel, plan.rnumel)
        with use_handler(handler):
            node.data.inner_fn(index, rindex) if placement == Placement.REDUCTION else node.data.inner_fn(index)
            if node.is_scatter:
                handler._note(node.buffer.layout.index(node.data.output_index(index)))
        for name, _ in node.reads:
            writer = plan.writer_of(name)
            if writer is None or writer.position >= node.position:
                inputs.append(kept.get(name, name))
    symbols = handler.symbols | set(kernel_sizes_symbols(plan))
    names = sorted({str(s) for s in symbols if s not in (XINDEX, RINDEX) and not is_indirect(s)})
    return list(dict.fromkeys(inputs)), [n for n in names if n not in ("xnumel", "rnumel")]
