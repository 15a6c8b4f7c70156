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

A value may read an input through a view ATen made (`z.real` of a complex input): that counts as
reading the input.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy

from ..ir import TensorBox, use_handler
from ..ir.extern import ExternKernel, MultiOutput, returns_fresh_buffer
from ..ir.ops import ReadsHandler
from ..scheduler.schedule import kahn_order
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

    buffers = {b.name: b for b in graph.buffers}
    writer = {w.target.name: k for k, w in enumerate(writes)}
    reads: list[set[str]] = []  # per write, the inputs (and buffers) its value reads
    copied: set[int] = set()
    for k, w in enumerate(writes):
        loads = _loads(w)
        names = _behind_views({name for name, _ in loads}, buffers)
        reads.append(names)
        # Its own input read at another element, or through an ATen view (no index to compare).
        direct = [index for name, index in loads if name == w.target.name]
        if any(not _same(index, w) for index in direct) or (w.target.name in names and not direct):
            copied.add(k)
    # A write runs after the writes whose values read its input.
    after: list[set[int]] = [set() for _ in writes]
    for j, names in enumerate(reads):
        for name in names:
            k = writer.get(name)
            if k is not None and k != j and j not in copied and k not in copied:
                after[k].add(j)
    order = [k for k in kahn_order(after) if k not in copied]
    copied |= set(range(len(writes))) - set(order)  # in a cycle, or after one
    sources = {k: w.source for k, w in enumerate(writes)}
    for k in sorted(copied):  # before any write: from the old contents
        sources[k] = TensorBox.of_storage(copy_to_new_buffer(graph, writes[k].source))
    for k in order + sorted(copied):
        writes[k].run(sources[k])


def _behind_views(names: set[str], buffers: dict) -> set[str]:
    """`names` with, for each ATen call's result that views its arguments (`z.real`, a complex
    input's `view_as_real`: calls smelt leaves to ATen), the buffers it views, transitively."""
    found, todo = set(names), list(names)
    while todo:
        buffer = buffers.get(todo.pop())
        if isinstance(buffer, MultiOutput):
            buffer = buffer.parent
        if not isinstance(buffer, ExternKernel) or returns_fresh_buffer(buffer):
            continue
        for viewed in buffer.inputs():
            name = viewed.storage_name
            if name not in found:
                found.add(name)
                todo.append(name)
    return found


def _loads(write: InputWrite) -> list[tuple[str, sympy.Expr]]:
    """(buffer, flat index) of each load the write's value makes, over the input's index."""
    handler = ReadsHandler()  # records loads without printing their indices (an optimizer step has thousands)
    with use_handler(handler):
        broadcast_loader(write.source, write.target.get_size())(_index_vars(write))
    return handler.reads


def _index_vars(write: InputWrite) -> list[sympy.Symbol]:
    return [index_var(f"i{k}") for k in range(len(write.target.get_size()))]


def _same(index, write: InputWrite) -> bool:
    """Whether a read of the written input is of the element it writes (an update in place)."""
    stored = write.target.layout.index(_index_vars(write))
    return index == stored or sympy.expand(sympy.sympify(index) - stored) == 0  # equal as written: the common case
