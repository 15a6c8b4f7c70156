"""Independent kernels gathered into one launch.

An optimizer step (or any loop over a list of tensors) leaves one small kernel per tensor: hundreds
of launches, each too small to fill the GPU. The caller gives each combinable step a key: which
launches it may share (its device, how it runs) and its kind (its generated body). A step moves
back to join an earlier combo of its key when nothing between them orders them: it neither reads
what any step since the combo's place writes nor writes what those steps read or write. Each combo
runs at its first member's place, in one launch (codegen/triton/combo.py), and the buffers'
lifetimes are planned again for the new order.

A backend without combo kernels (Halide) can still take steps of one iteration space merged: the
members' nodes become one fused kernel with every member's outputs (`merge`). On the CPU a call
costs microseconds of host time, and a for-loop optimizer makes a few tiny kernels per parameter.

A step moves back only where that cannot raise the graph's peak: its buffers, alive from the combo's
place on, added to what is alive at each step it moves over (and its dying inputs taken away), must
stay under the most the schedule holds at once. A zero fill moved to the start of a backward would
hold its memory through every layer before its own, where the saved activations are at their most;
a forward's weight casts may all move to its start, which holds little.

Several combos of one key stay open at once, so kernels that alternate with ones they depend on
(a for-loop optimizer: step count i, then parameter i, which reads it) still end up in one combo
per kind of kernel, not one per tensor.
"""
from __future__ import annotations

import bisect
import copy
from typing import Callable, Hashable

from ..symbolic import static_int
from .live_bytes import buffer_sizes, live_bytes
from .schedule import Step, plan_frees

# Members per launch at most: the pointer table grows with them, nothing else does.
MAX_MEMBERS = 1024
# Kinds (bodies) per launch at most: each is a branch of the kernel, compiled with it.
MAX_KINDS = 8
# Open combos per key: older ones are closed, bounding the search per step.
MAX_OPEN = 32
# Members of a merged kernel at most: its compile grows with them (one Halide pipeline).
MAX_MERGED = 32
# A step allocating at most this many bytes moves back freely (a scalar, a norm weight's partial
# sums); a larger one only where the peak allows, or never where sizes are symbolic.
MOVE_BYTES = 1 << 20
# A pointwise kernel this small costs less to run than to call (a Halide call from Python is a few
# microseconds): worth merging with others of its size.
MERGE_NUMEL = 1 << 12


class _Window:
    """An open combo: its place, its kinds and what the steps placed at or after it access."""

    def __init__(self, index: int, kind: Hashable, origin: int):
        self.index = index
        self.origin = origin  # the first member's index in the steps as given
        self.kinds = {kind}
        self.read: set[str] = set()
        self.written: set[str] = set()
        self.filled: set[str] = set()  # shared storages some slice of which is written

    def admits(self, accesses: "_Accesses", kind: Hashable, size: int, limit: int) -> bool:
        if size >= limit or (kind not in self.kinds and len(self.kinds) >= MAX_KINDS):
            return False
        # Slices of one storage are disjoint: their writers need no order among themselves.
        return (not accesses.reads & (self.written | self.filled) and not accesses.writes & (self.read | self.written)
                and not accesses.fills & self.read)

    def add(self, accesses: "_Accesses") -> None:
        self.read |= accesses.reads
        self.written |= accesses.writes
        self.filled |= accesses.fills


def combine(steps: list[Step], key_of: Callable[[Step], tuple[Hashable, Hashable] | None], outputs: set[str],
            graph, merge: Callable[[Hashable], bool] = lambda key: False) -> list[Step]:
    """The steps with combinable ones gathered into combo steps. key_of gives a step's (launch key,
    kind), or None for a step never combined; the steps of a key that `merge` names become one
    fused kernel instead (they must share an iteration space: the key says so)."""
    placed: list[Step] = []
    open_windows: dict[Hashable, list[_Window]] = {}
    to_merge: set[int] = set()  # ids of the placed combos to become one fused kernel
    live_bytes = _LiveBytes(steps, outputs, graph)
    for index, step in enumerate(steps):
        accesses = _Accesses(step)
        keyed = key_of(step) if not step.is_extern and not step.finishers else None
        window = None
        if keyed is not None:
            key, kind = keyed
            candidates = open_windows.get(key, [])
            # A window that has this kind already first: members of one kind share a branch.
            for w in sorted(candidates, key=lambda w: kind not in w.kinds):
                limit = MAX_MERGED if merge(key) else MAX_MEMBERS
                if w.admits(accesses, kind, len(placed[w.index].combo), limit) \
                        and live_bytes.move_back(index, step, w.origin):
                    window = w
                    break
        if window is not None:
            placed[window.index].combo.append(step)
            window.kinds.add(kind)
            position = window.index
        else:
            position = len(placed)
            placed.append(Step(step.group, combo=[step], kept_in_input=step.kept_in_input, target=step.target) if keyed is not None else step)
            if keyed is not None:
                if merge(key):
                    to_merge.add(id(placed[-1]))
                windows = open_windows.setdefault(key, [])
                windows.append(_Window(position, kind, index))
                del windows[:-MAX_OPEN]
            if step.is_extern and orders_everything(step):
                open_windows.clear()
        # The step now runs at `position`: a later step that joins a window at or before it
        # moves ahead of it, one that joins a later window does not.
        for windows in open_windows.values():
            for w in windows:
                if w.index <= position:
                    w.add(accesses)
    result = []
    for step in placed:
        if step.combo and len(step.combo) == 1:
            result.append(step.combo[0])
        elif step.combo and id(step) in to_merge:
            result.append(_merged(step.combo))
        elif step.combo:
            step.stored = [name for member in step.combo for name in member.stored]
            result.append(step)
        else:
            result.append(step)
    if len(result) != len(steps):
        plan_frees(result, outputs, graph)
    return result


def merge_key(step: Step) -> tuple[Hashable, Hashable] | None:
    """The (launch key, kind) under which a tiny pointwise step merges with others of its size
    (see `merge`), or None."""
    group = step.group
    if group.is_reduction or any(n.is_scatter for n in group.nodes):
        return None
    numel = static_int(group.xnumel)
    if not numel or numel > MERGE_NUMEL:
        return None
    return ("merge", str(group.nodes[0].buffer.get_device()), numel), None


def is_merge_key(key: Hashable) -> bool:
    return isinstance(key, tuple) and key[:1] == ("merge",)


def _merged(members: list[Step]) -> Step:
    """One kernel computing every member's nodes (independent, of one iteration space)."""
    group = copy.copy(members[0].group)
    group.nodes = [n for m in members for n in m.group.nodes]
    return Step(group, stored=[name for m in members for name in m.stored], kept_in_input=members[0].kept_in_input,
                target=members[0].target)


class _LiveBytes:
    """The bytes alive at each step (buffers the graph allocates, and the saved activations it owns),
    kept up to date as steps move back, and the peak they must stay under."""

    def __init__(self, steps: list[Step], outputs: set[str], graph):
        self.sizes = buffer_sizes(graph)
        self.last_reader: dict[str, int] = {}
        reads = [set().union(*(node.read_names for node in step.nodes)) for step in steps]
        for k, names in enumerate(reads):
            for name in names:
                self.last_reader[name] = k
        self.outputs = outputs
        allocations = [step.allocated() for step in steps]
        # what the figures count: memory the graph allocates or owns (a multi-result call: its parts)
        self.counted = {name for made in allocations for name in made if name in self.sizes}
        self.counted |= {name for name in graph.donated_inputs if name in self.sizes}
        self.peak = 0
        self.live = None
        if all(self.sizes[name] is not None for name in self.counted):  # else no figure to compare against
            self.live = live_bytes(allocations, reads, {n: self.sizes[n] for n in self.counted},
                                   graph.donated_inputs, outputs)
            self.peak = max(self.live, default=0)

    def move_back(self, index: int, step: Step, origin: int) -> bool:
        """Whether `step` may run at the place of the step at `origin`; if so, the figures move with it."""
        sizes = [self.sizes.get(name) for name in step.allocated()]
        allocated = None if None in sizes else sum(sizes)
        if allocated is not None and allocated <= MOVE_BYTES:
            return True
        if allocated is None or self.live is None:
            return False
        dying = {name for n in step.nodes for name in n.read_names
                 if self.last_reader.get(name) == index and name in self.counted and name not in self.outputs}
        freed = sum(self.sizes.get(name) or 0 for name in dying)
        # From origin on its results are alive too; after origin its dying inputs are not.
        grown = [self.live[k] + (allocated if k < index else 0) - (freed if k > origin else 0)
                 for k in range(origin, index + 1)]
        if max(grown) > self.peak:
            return False
        self.live[origin:index + 1] = grown
        for name in dying:
            self.last_reader[name] = origin
        return True


class _Accesses:
    """The names a step reads and writes, and the shared storages it writes slices of."""

    def __init__(self, step: Step):
        self.reads = set().union(*(n.read_names for n in step.nodes))
        self.writes = {n.write_name for n in step.nodes} | {n.name for n in step.nodes}
        self.fills = {n.fills for n in step.nodes if n.fills is not None}


def orders_everything(step: Step) -> bool:
    """An ATen call with effects beyond its output (an assert, .item(), a custom op) stays between
    the kernels before and after it."""
    buffer = step.group.nodes[0].buffer
    return buffer.has_side_effects or not buffer.binds_name


def with_a_possible_partner(steps: list[Step], family: Callable[[Step], Hashable | None]) -> set[int]:
    """The ids of the steps that `combine` could put in one launch with another step of the same
    `family` (None: no family): a later step joins an earlier one's combo only by moving back to
    it, so none of the later step's ancestors (the steps it is ordered after by what they read and
    write, directly or through others) may lie at or after the earlier one. A key that costs work
    (a generated body) need not be computed for the others: the same norm in each of a model's
    layers, each reading the last one's output. The peak memory and the kinds per launch decide
    too; an ancestor that itself moves back into an earlier launch is not foreseen, and a step
    left out for it stays alone (the same combos as keying every step, on six suite models' graphs)."""
    latest: list[int] = []  # per step, the position of its latest ancestor (-1: none)
    before: list[int] = []  # per step, a bit per ancestor
    last_write: dict[str, int] = {}
    readers: dict[str, list[int]] = {}  # since the last write
    fillers: dict[str, list[int]] = {}  # of slices of a shared storage, since the last write
    for i, step in enumerate(steps):
        accesses = _Accesses(step)
        after: set[int] = set()
        for name in accesses.reads:
            after.update(fillers.get(name, ()))
            if name in last_write:
                after.add(last_write[name])
        for name in accesses.writes:
            after.update(readers.get(name, ()))
            if name in last_write:
                after.add(last_write[name])
        for name in accesses.fills:
            after.update(readers.get(name, ()))
        bits = 0
        for j in after:
            bits |= before[j] | (1 << j)
        before.append(bits)
        latest.append(bits.bit_length() - 1)
        for name in accesses.reads:
            readers.setdefault(name, []).append(i)
        for name in accesses.writes:
            last_write[name] = i
            readers.pop(name, None)
            fillers.pop(name, None)
        for name in accesses.fills:
            fillers.setdefault(name, []).append(i)
    members: dict[Hashable, list[int]] = {}
    for i, step in enumerate(steps):
        f = family(step)
        if f is not None:
            members.setdefault(f, []).append(i)
    possible: set[int] = set()
    for indices in members.values():
        for j in indices:
            # the nearest earlier member past j's latest ancestor, if any
            k, own = bisect.bisect_right(indices, latest[j]), bisect.bisect_left(indices, j)
            if k < own:  # j may join any of indices[k:own]
                possible.add(id(steps[j]))
                possible.update(id(steps[i]) for i in indices[k:own])
    return possible
