"""Writes into graph inputs, run after everything else the graph computes.

AOTAutograd's functional graph ends with a `copy_(input, new_value)` per input the program
mutated; each new value was computed from the inputs' old contents. Together the copies are one
parallel assignment, but smelt performs them one after another, each a kernel writing the input
(or an ATen call): a later copy whose value reads an input an earlier copy wrote would read it
changed (`a.mul_(0.5); b.add_(a)` added a quarter of a, not a half). So:

- a copy whose value reads another written input runs before the copy writing that input;
- copies that read each other's inputs in a cycle (a swap), and a copy whose value reads its own
  input at another element than the one it writes (`a.copy_(a.flip(0))`: its programs would read
  elements others already wrote), have their values computed into new buffers before any write.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy

from ..ir import TensorBox, use_handler
from ..ir.ops import ReadsHandler
from ..symbolic import index_var
from .common import broadcast_loader


@dataclasses.dataclass
class InputWrite:
    """A write of `source` (broadcast to the input's size) into the graph input `target` (an
    InputBuffer); `run(source)` registers it."""

    target: object
    source: TensorBox
    run: Callable[[TensorBox], None]


def run_input_writes(graph, writes: list[InputWrite]) -> None:
    """Registers the writes in an order (and with copies) under which each reads old contents."""
    from .scatter import copy_to_new_buffer  # scatter.py imports the lowerings' common helpers

    reads = [_reads(w) for w in writes]
    copied = set()
    for k, (w, found) in enumerate(zip(writes, reads)):
        if any(name == w.target.name and not _same(index, w) for name, index in found):
            copied.add(k)
    # Each write before the writes of the inputs its value reads; what is left over is in a cycle.
    before = {k: {j for j, other in enumerate(writes) if j != k and other.target.name in
                  {name for name, _ in reads[k]}} for k in range(len(writes)) if k not in copied}
    order: list[int] = []
    waiting = {k: {j for j in before if k in before[j]} for k in before}  # k waits for the writes reading its input
    while True:
        ready = [k for k in sorted(waiting) if not waiting[k]]
        if not ready:
            break
        k = ready[0]
        order.append(k)
        del waiting[k]
        for rest in waiting.values():
            rest.discard(k)
    copied |= set(waiting)
    sources = {k: writes[k].source for k in range(len(writes))}
    for k in sorted(copied):  # before any write: from the old contents
        sources[k] = TensorBox.of_storage(copy_to_new_buffer(graph, writes[k].source))
    for k in order + sorted(copied):
        writes[k].run(sources[k])


def _reads(write: InputWrite) -> list[tuple[str, sympy.Expr]]:
    """(buffer, flat index) of each load the write's value makes, over the input's index."""
    handler = ReadsHandler()
    with use_handler(handler):
        broadcast_loader(write.source, write.target.get_size())(_index_vars(write))
    return handler.reads


def _index_vars(write: InputWrite) -> list[sympy.Symbol]:
    return [index_var(f"i{k}") for k in range(len(write.target.get_size()))]


def _same(index, write: InputWrite) -> bool:
    """Whether a read of the written input is of the element it writes (an update in place)."""
    stored = write.target.layout.index(_index_vars(write))
    return sympy.expand(sympy.sympify(index) - stored) == 0
