"""Kernels reordered so that big buffers die before others are allocated.

The steps come in the traced graph's order, which AOTAutograd's backward writes op by op: a
linear layer's input gradient (`grad @ W`, a fresh [tokens, 4 x hidden] buffer) before its weight
gradient (`grad^T @ gelu_out`, after which the saved GELU output dies). Run in that order both
[tokens, 4 x hidden] buffers are alive at once; the other way round, the saved one is freed first.
ViT-Base's AMP training step on the H200 held one more 37 MiB block than Inductor's at its peak
for exactly that reason.

So the steps are listed again: the earliest ready step in the original order runs next, unless a
ready step would free more bytes than it allocates (it is the last reader of a saved activation or
buffer, and its results are smaller) and allocates no more than that earliest one: while it runs,
its inputs and results are alive together, so it must not hold more then than the step it goes
ahead of. A second listing also holds back steps whose results only the output (or other held-back
steps) reads and that allocate more than they free: a classifier's float32 weight gradient made at
the backward's start stood beside EfficientNet's convolution backward at its peak (4.9 MiB over
Inductor's, on the CPU), and GPT-2's step held its head's gradient through the whole backward. A
third holds back also steps whose readers only lead to the output: Whisper's tied head's weight
gradient, read by the sum with the embedding's gradient at the backward's end (its CPU training
peak 475.0 -> 439.4 MiB, Inductor's 443.3).

Of the first two listings, the one holding the fewest bytes summed over the steps is kept, if it
holds fewer than the traced order and no more at once; the third replaces it only where its peak is
lower (holding back more for bytes summed alone raised DistilBERT's CPU training peak 10%). The
estimate: buffers alive from their writer to their last reader, donated inputs from the start, and a
kernel's result written over an input dying in it taking no memory of its own where reuse.py's rule
roughly allows it. An ATen call's own scratch is not seen (EfficientNet's peak).

A step runs after every step before it that it depends on in the original order: one that writes
what it reads (or reads or writes what it writes, for writes into inputs and scatters), slices of
a storage it reads, and calls with effects beyond their result (asserts, `.item()`), which stay
between the steps around them. A view an ATen call returns counts as its inputs.
"""
from __future__ import annotations

import bisect
import heapq

from ..ir.extern import returns_fresh_buffer
from .combo import orders_everything
from .live_bytes import buffer_sizes, live_bytes
from .schedule import Step, plan_memory

# A step moves ahead of the original order only to free at least this many bytes more than it
# allocates: smaller moves reorder the graph for nothing worth having.
MIN_FREED_BYTES = 1 << 20


def order_for_memory(steps: list[Step], outputs: set[str], graph) -> list[Step]:
    """The steps in the order of the listing chosen by the estimate (see the module docstring),
    their memory planned again; or `steps` as they are."""
    if len(steps) < 3 or any(s.combo or s.finishers for s in steps):
        return steps
    order = _MemoryOrder(steps, outputs, graph)
    if order.sizes is None:
        return steps  # a symbolic size: no figure to compare
    traced_peak, traced_held = order.live(range(len(steps)))
    kept = [(held, peak, new) for new in (order.greedy(None), order.greedy(order.held(False)))
            for peak, held in [order.live(new)] if peak <= traced_peak and held < traced_held]
    _, bar, new = min(kept, key=lambda kept_one: kept_one[0]) if kept else (None, traced_peak, None)
    # The third listing moves more (whole chains to the backward's end): only for a lower peak.
    through = order.greedy(order.held(True))
    if order.live(through)[0] + MIN_FREED_BYTES <= bar:
        new = through
    if new is None:
        return steps
    reordered = [steps[k] for k in new]
    for step in reordered:
        step.stored, step.frees, step.kept_in_input = [], [], {}
        step.__dict__.pop("plan", None)  # a kernel plan made for the old stores
    plan_memory(reordered, outputs, graph)
    return reordered


class _MemoryOrder:
    def __init__(self, steps: list[Step], outputs: set[str], graph):
        self.steps = steps
        self.aliases: dict[str, set[str]] = {}  # a view an ATen call returns -> the memory it shows
        self.reads: list[set[str]] = []
        self.preds: list[set[int]] = []
        self.pure: list[bool] = []  # writes nothing but its own results, and is no barrier
        self._dependencies()
        self.outputs = self._expand(outputs)
        self.made = [step.allocated() for step in steps]
        counted = set(graph.donated_inputs) | {name for made in self.made for name in made}
        every = buffer_sizes(graph)
        sizes = {name: every[name] for name in counted if name in every}
        self.sizes = None if None in sizes.values() else sizes
        self.donated = [name for name in graph.donated_inputs if name in sizes]
        if self.sizes is not None:
            self.over_inputs = self._over_inputs(graph)

    def _over_inputs(self, graph) -> list[list[tuple[str, list[str]]]]:
        """Per step, its result and the inputs it might be written over (reuse.py's rule, roughly:
        a kernel storing one result, or one beside per-row values; an input of the same element type
        that a kernel or a fresh ATen result allocated, or a donated one, that no ATen view reads)."""
        dtypes = {b.name: b.layout.dtype for b in graph.buffers if getattr(b, "layout", None) is not None}
        dtypes.update({name: v.layout.dtype for name, v in graph.inputs if hasattr(v, "layout")})
        shared = getattr(graph, "shared_storages", {})
        owned = {name for made in self.made for name in made} | set(self.donated)
        owned -= {name for shown in self.aliases.values() for name in shown}
        pairs = []
        for k, step in enumerate(self.steps):
            sized = sorted((self.sizes.get(name, 0), name) for name in self.made[k])
            # (A cat's shared storage is never written over an input: reuse.py leaves slices alone.)
            if step.is_extern or not sized or sum(size for size, _ in sized[:-1]) * 16 > sized[-1][0] \
                    or sized[-1][1] in shared:
                pairs.append([])
                continue
            result = sized[-1][1]
            inputs = [name for name in sorted(self.reads[k]) if name in owned and name != result
                      and name in self.sizes and dtypes.get(name) == dtypes.get(result)]
            pairs.append([(result, inputs)] if inputs else [])
        return pairs

    def _expand(self, names) -> set[str]:
        found = set(names)
        for name in names:
            found |= self.aliases.get(name, set())
        return found

    def _dependencies(self) -> None:
        last_writer: dict[str, int] = {}
        readers_since: dict[str, list[int]] = {}  # of each name, since its last write
        barrier, since_barrier = None, []
        for k, step in enumerate(self.steps):
            nodes = step.nodes
            reads = self._expand(set().union(*(n.read_names for n in nodes)))
            writes = self._expand({n.write_name for n in nodes} | {n.name for n in nodes}
                                  | {n.fills for n in nodes if n.fills is not None})
            preds = {last_writer[name] for name in reads | writes if name in last_writer}
            for name in writes:
                preds.update(readers_since.get(name, ()))
            if _is_barrier(step, nodes):
                preds.update(since_barrier)
                since_barrier = []
                barrier = k
            elif barrier is not None:
                preds.add(barrier)
            preds.discard(k)
            since_barrier.append(k)
            for name in reads:
                readers_since.setdefault(name, []).append(k)
            for name in writes:
                last_writer[name] = k
                readers_since[name] = []
            node = nodes[0]
            if step.is_extern and node.buffer.binds_name and not returns_fresh_buffer(node.buffer):
                self.aliases[node.write_name] = reads
            self.reads.append(reads)
            self.preds.append(preds)
            self.pure.append(all(n.write_name == n.name and n.fills is None for n in nodes)
                             and not _is_barrier(step, nodes))

    def greedy(self, held: list[bool] | None) -> list[int]:
        """The earliest ready step next, but for one freeing more than it allocates, and, given
        `held`, for those steps, run as late as their readers allow."""
        n = len(self.steps)
        hold_back = held is not None
        held = held or [False] * n
        waiting = [len(p) for p in self.preds]
        successors: list[list[int]] = [[] for _ in range(n)]
        for k, preds in enumerate(self.preds):
            for p in preds:
                successors[p].append(k)
        readers_left: dict[str, int] = {}
        for reads in self.reads:
            for name in reads:
                readers_left[name] = readers_left.get(name, 0) + 1
        # Only a step that could free enough, were it the last reader of all it reads, is ever a candidate.
        could_free = [sum(self.sizes.get(name, 0) for name in self.reads[k] if name not in self.outputs)
                      - self._allocates(k) >= MIN_FREED_BYTES for k in range(n)]
        ready = [k for k in range(n) if not waiting[k]]
        heapq.heapify(ready)
        candidates = sorted(k for k in ready if could_free[k])
        order: list[int] = []
        while ready:
            first = next((k for k in sorted(ready) if not held[k]), ready[0]) if hold_back else ready[0]
            pick = next((k for k in candidates if self._allocates(k) <= self._allocates(first)
                         and self._frees(k, readers_left) >= MIN_FREED_BYTES), first)
            ready.remove(pick)
            heapq.heapify(ready)
            if could_free[pick]:
                candidates.remove(pick)
            order.append(pick)
            for name in self.reads[pick]:
                readers_left[name] -= 1
            for s in successors[pick]:
                waiting[s] -= 1
                if not waiting[s]:
                    heapq.heappush(ready, s)
                    if could_free[s]:
                        bisect.insort(candidates, s)
        assert len(order) == n, "smelt: the steps' dependencies have a cycle"
        return order

    def held(self, through_readers: bool) -> list[bool]:
        """Steps worth running as late as their dependencies allow: ones whose results only the
        output or other such steps read, that allocate at least MIN_FREED_BYTES more than they free
        where the traced order runs them (a weight gradient's float32 cast, and its product where
        the inputs are small), and that write nothing else. through_readers: also ones whose
        readers lead only to the output (a tied head's weight gradient, which the embedding's
        gradient is added to at the backward's end: Whisper's)."""
        n = len(self.steps)
        toward_output = self._toward_output() if through_readers else [False] * n
        last_reader: dict[str, int] = {}
        readers: dict[str, list[int]] = {}
        for k, reads in enumerate(self.reads):
            for name in reads:
                last_reader[name] = k
                readers.setdefault(name, []).append(k)
        held = [False] * n
        for k in reversed(range(n)):
            if not (self.made[k] and self.pure[k]):
                continue
            freed = sum(self.sizes.get(name, 0) for name in self.reads[k]
                        if last_reader.get(name) == k and name not in self.outputs)
            held[k] = (self._allocates(k) - freed >= MIN_FREED_BYTES
                       and all(held[j] or toward_output[j] for name in self.made[k] for j in readers.get(name, ())))
        return held

    def _toward_output(self) -> list[bool]:
        """Steps writing nothing but results that are outputs or read only by such steps."""
        readers: dict[str, list[int]] = {}
        for k, reads in enumerate(self.reads):
            for name in reads:
                readers.setdefault(name, []).append(k)
        found = [False] * len(self.steps)
        for k in reversed(range(len(self.steps))):
            found[k] = bool(self.made[k]) and self.pure[k] and all(
                name in self.outputs or (readers.get(name) and all(found[j] for j in readers[name]))
                for name in self.made[k])
        return found

    def _allocates(self, k: int) -> int:
        return sum(self.sizes.get(name, 0) for name in self.made[k])

    def _frees(self, k: int, readers_left: dict[str, int]) -> int:
        """Bytes freed by running step k now (it is the last reader left) less the bytes it allocates."""
        freed = sum(self.sizes.get(name, 0) for name in self.reads[k]
                    if readers_left[name] == 1 and name not in self.outputs)
        return freed - self._allocates(k)

    def live(self, order) -> tuple[int, int]:
        """The most bytes alive at once, and their sum over the steps (live_bytes.py)."""
        order = list(order)
        live = live_bytes([self.made[k] for k in order], [self.reads[k] for k in order], self.sizes,
                          self.donated, self.outputs, [self.over_inputs[k] for k in order])
        return max(live, default=0), sum(live)


def _is_barrier(step: Step, nodes: list) -> bool:
    return (step.is_extern and orders_everything(step)) or any(
        getattr(n.buffer, "has_side_effects", False) for n in nodes)
