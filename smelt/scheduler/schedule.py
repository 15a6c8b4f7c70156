"""From an IR graph to an ordered list of steps: dead code dropped, loop nests fused, memory planned."""
from __future__ import annotations

import heapq

import dataclasses
import functools

from ..ir.extern import returns_fresh_buffer
from ..ir.scalars import DynamicScalar
from .fusion import FusedGroup, can_fuse
from .kernel_plan import KernelPlan, plan_kernel
from .live_bytes import buffer_sizes
from .nodes import SchedulerNode
from ..target import Target


@dataclasses.dataclass
class Step:
    """One launch: a fused kernel (group) or an ATen call (extern)."""

    group: FusedGroup
    stored: list[str] = dataclasses.field(default_factory=list)  # buffers the kernel writes to memory
    frees: list[str] = dataclasses.field(default_factory=list)  # buffers dead after this step
    # Small reductions of this kernel's results that its last program runs, in order
    # (codegen/triton/finisher.py).
    finishers: list["Step"] = dataclasses.field(default_factory=list)
    # Independent kernels launched together (scheduler/combo.py); `group` is the first's.
    combo: list["Step"] = dataclasses.field(default_factory=list)
    # Buffers the graph's kernels read from the graph input that holds the same values, by name
    # (plan_memory's _keep_in_inputs); one map, shared by every step of a schedule.
    kept_in_input: dict = dataclasses.field(default_factory=dict)
    target: Target | None = None  # of the backend that prints it (smelt/target.py); None: extern

    @property
    def is_extern(self) -> bool:
        return self.group.is_extern

    @functools.cached_property
    def plan(self) -> KernelPlan:
        """The kernel's plan (placements, phases, tiling), made once, when first asked for: after
        memory planning has fixed `stored`. Every backend prints the step from it."""
        return plan_kernel(self.group, list(self.stored), self.kept_in_input, self.target)

    def allocated(self) -> list[str]:
        """The buffers this step allocates: a kernel's stores (not writes into inputs or kept
        inputs), an ATen call's fresh result. A slice of a shared storage names the storage, which
        the wrapper allocates whole with its first slice (a cat's slice moved back by the combo pass
        counted as the slice's bytes alone: the whole last cat of a dense block went along)."""
        if self.is_extern:
            node = self.group.nodes[0]
            return [node.write_name] if node.buffer.binds_name and returns_fresh_buffer(node.buffer) else []
        made = [n.fills or n.write_name for n in self.nodes if n.write_name == n.name and n.write_name in self.stored
                and n.write_name not in self.kept_in_input]
        return list(dict.fromkeys(made))

    @property
    def nodes(self) -> list:
        """Every node this step computes: its group's, its finishers' and its combo members'."""
        steps = self.combo or [self]
        return [n for s in steps for g in [s.group] + [f.group for f in s.finishers] for n in g.nodes]


@dataclasses.dataclass
class Schedule:
    graph: object
    steps: list[Step]
    # Buffers a kernel stores over a buffer that dies in it, {stored: dying} (scheduler/reuse.py).
    reuses: dict = dataclasses.field(default_factory=dict)
    # Buffers that take a dead buffer's memory instead of allocating, {buffer: dead} (scheduler/pool.py).
    pool: dict = dataclasses.field(default_factory=dict)
    # CPU buffers placed in a block kept between calls (scheduler/workspace.py); None: none.
    workspace: object = None

    def describe(self) -> str:
        lines = []
        for k, step in enumerate(self.steps):
            g = step.group
            if step.is_extern:
                lines.append(f"step {k}: extern {g.nodes[0].buffer.describe()}")
            else:
                kind = "pointwise" if not g.is_reduction else ("scan" if any(n.is_scan for n in g.nodes) else "reduction")
                members = ", ".join(f"{n.name}({p})" for n, p in zip(g.nodes, g.placements().values()))
                lines.append(f"step {k}: {kind} kernel over {g.xnumel} x {g.rnumel}: {members}; "
                             f"stores {', '.join(step.stored) or 'nothing'}")
            for finisher in step.finishers:
                f = finisher.group
                lines.append(f"    its last program then reduces over {f.xnumel} x {f.rnumel}: "
                             f"{', '.join(n.name for n in f.nodes)}; stores {', '.join(finisher.stored)}")
            if step.combo:
                lines.append(f"    launched with {len(step.combo) - 1} more independent kernels: "
                             f"{', '.join(m.group.nodes[0].name for m in step.combo[1:])}")
            if step.frees:
                lines.append(f"    then frees {', '.join(step.frees)}")
        return "\n".join(lines)


def schedule(graph) -> Schedule:
    nodes = [SchedulerNode(b, k) for k, b in enumerate(graph.buffers)]
    _add_scalar_reads(nodes)
    nodes = in_dependency_order(nodes)
    outputs = {o.name for o in graph.outputs if o.name is not None}
    nodes = drop_dead(nodes, outputs)
    groups = fuse(nodes, buffer_sizes(graph))
    steps = [Step(g, target=None if g.is_extern else graph.target_for(g.nodes[0].buffer.get_device().type))
             for g in groups]
    plan_memory(steps, outputs, graph)
    return Schedule(graph, steps)


def _add_scalar_reads(nodes: list[SchedulerNode]) -> None:
    """A node whose sizes or body use a symbol bound by `.item()` reads the step that binds it,
    so that step stays alive and runs first."""
    binders = {str(n.buffer.symbol): n.name for n in nodes if isinstance(n.buffer, DynamicScalar)}
    if not binders:
        return
    for node in nodes:
        for symbol in node.mentioned_symbols() & binders.keys():
            if binders[symbol] != node.name:
                node.read_names = node.read_names | {binders[symbol]}


def kahn_order(after) -> list[int]:
    """Indices 0..len(after)-1, each after every index `after[i]` names, the smallest ready one
    first (the given order where nothing decides); indices in a cycle, or after one, are left out."""
    waiting = [len(a) for a in after]
    followers: list[list[int]] = [[] for _ in after]
    for i, a in enumerate(after):
        for j in a:
            followers[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in followers[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    return order


def in_dependency_order(nodes: list[SchedulerNode]) -> list[SchedulerNode]:
    """The nodes in program order, but each after the buffers it reads.

    Buffers are registered as they are realized, and a loop body that makes its input's loader when
    it is traced (a max pool's window) reads that input's buffer even when the input was realized
    after it (a pooled stack also returned: the pool's kernel ran before the stack was written).
    A reader waits for the node that makes what it reads, and for the writes into it placed before
    the reader; a write into an existing buffer (a scatter, an input updated in place) stays after
    the readers placed before it, which want the old contents. Raises on a cycle: no order is right.
    """
    made_by: dict[str, int] = {}  # buffer name -> the node that makes it
    writes: dict[str, list[int]] = {}  # an existing buffer (an input, a shared storage) -> nodes writing into it
    for i, node in enumerate(nodes):
        made_by[node.name] = i
        for target in {node.write_name if node.write_name != node.name else None, node.fills} - {None}:
            writes.setdefault(target, []).append(i)
    after: list[set[int]] = [set() for _ in nodes]  # node -> the nodes it must follow
    for i, node in enumerate(nodes):
        for name in node.read_names:
            if name in made_by:
                after[i].add(made_by[name])
            for w in writes.get(name, ()):
                if w < i:
                    after[i].add(w)
                else:  # a write placed after this reader: the reader wants the contents before it
                    after[w].add(i)
    for targets in writes.values():  # writes into one buffer keep their order
        for earlier, later in zip(targets, targets[1:]):
            after[later].add(earlier)
    for i in range(len(nodes)):
        after[i].discard(i)
    if all(j < i for i in range(len(nodes)) for j in after[i]):
        return nodes  # already in order: the usual case
    order = kahn_order(after)
    if len(order) != len(nodes):
        placed = set(order)
        stuck = [nodes[i].name for i in range(len(nodes)) if i not in placed]
        raise RuntimeError(f"smelt: no order of the graph's steps lets each read what it needs: {', '.join(stuck[:8])}")
    ordered = [nodes[i] for i in order]
    for position, node in enumerate(ordered):  # fusion and codegen take a member's position as its turn
        node.position = position
    return ordered


def drop_dead(nodes: list[SchedulerNode], outputs: set[str]) -> list[SchedulerNode]:
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        # A write into a graph input is kept even when nothing reads it; a scatter only when its target is.
        mutates = node.buffer.mutates is not None and not node.is_scatter
        effectful = node.buffer.has_side_effects
        fills_needed = node.fills is not None and node.fills in needed
        if node.write_name in needed or mutates or effectful or node.name in needed or fills_needed:
            kept.append(node)
            needed |= node.read_names
    return list(reversed(kept))


def fuse(nodes: list[SchedulerNode], sizes: dict | None = None) -> list[FusedGroup]:
    """Greedy fusion in program order: each node joins the best earlier group it may legally join.
    `sizes`: bytes by buffer name (live_bytes.buffer_sizes), for `_allocates_early`."""
    sizes = sizes or {}
    groups: list[FusedGroup] = []
    group_index: dict[str, int] = {}  # buffer name -> index of the group that writes it
    readers: dict[str, set[int]] = {}  # buffer name -> indices of the groups that read it
    fillers: dict[str, list[int]] = {}  # shared storage -> indices of the groups writing slices of it
    last_extern = -1  # index of the latest ATen call's group
    for node in nodes:
        choice = None
        if not node.is_extern:
            for k in _candidates(groups, group_index, readers, fillers, node):
                allowed = _order_allows(group_index, readers, k, node) and \
                    not (last_extern > k and _allocates_early(group_index, readers, fillers, sizes, k, node))
                shape = can_fuse(groups[k], node) if allowed else None
                if shape is not None:
                    choice = (k, shape)
                    break
        if choice is None:
            groups.append(FusedGroup(node))
            k = len(groups) - 1
            last_extern = k if node.is_extern else last_extern
        else:
            k, (xnumel, rnumel) = choice
            groups[k].nodes.append(node)
            groups[k].xnumel, groups[k].rnumel = xnumel, rnumel
        group_index[node.write_name] = k
        group_index[node.name] = k
        if node.fills is not None:  # the storage is ready once its last-placed slice is
            group_index[node.fills] = max(k, group_index.get(node.fills, k))
            fillers.setdefault(node.fills, []).append(k)
        for name in node.read_names:
            readers.setdefault(name, set()).add(k)
    return groups


def _candidates(groups, group_index, readers, fillers, node) -> list[int]:
    """Groups worth joining, best first: producers of what node reads, then groups sharing its
    inputs, then (for a slice of a shared storage, a cat's input) groups writing other slices of it."""
    producers = sorted({group_index[n] for n in node.read_names if n in group_index}, reverse=True)
    shared: dict[int, int] = {}  # group -> how many of node's inputs it reads
    for name in node.read_names:
        for k in readers.get(name, ()):
            shared[k] = shared.get(k, 0) + 1
    sharing = sorted((k for k in shared if k not in producers and not groups[k].is_extern),
                     key=lambda k: (-shared[k], k))
    taken = set(producers) | set(sharing)
    siblings = sorted({k for k in fillers.get(node.fills, ()) if k not in taken}, reverse=True)
    return producers + sharing + siblings


def _allocates_early(group_index, readers, fillers, sizes, k: int, node: SchedulerNode) -> bool:
    """Whether node, joining group k, which computes none of what it reads, would allocate the
    storage it writes earlier, before an ATen call its own kernel would follow (the caller asks
    only then), when that storage is larger than the inputs the two share: it would live across
    the call to save a read of less.
    (Apart, the shared inputs may live on to node's own kernel instead: a fused q/k/v product whose
    three copies share one kernel.) DenseNet's cats copied each new feature into every later cat of
    its block in one kernel: all 17 cats of a block allocated at its start, 162 MiB at once against
    eager's 154 (bf16 inference, batch 32)."""
    if any(group_index.get(name) == k for name in node.read_names) or node.write_name != node.name:
        return False  # k computes an input (the node must follow it), or node writes into a graph input
    storage = node.fills or node.write_name
    first = min(fillers.get(storage, ()), default=None) if node.fills else group_index.get(storage)
    if first is not None and first <= k:
        return False  # allocated by then already
    shared = [sizes.get(name) for name in node.read_names if k in readers.get(name, ())]
    if sizes.get(storage) is None or None in shared:
        return False  # a symbolic size: joined, as before the rule
    return sizes[storage] > sum(shared)


def _order_allows(group_index, readers, k: int, node: SchedulerNode) -> bool:
    """Node may run inside group k only if all it reads is ready by then and no later group
    expects the old contents of what it writes."""
    for name in node.read_names:
        j = group_index.get(name)
        if j is not None and j > k:
            return False
    if node.write_name != node.name:  # writes into a graph input: later readers want the old value
        if any(j > k for j in readers.get(node.write_name, ())):
            return False
    return True


def plan_memory(steps: list[Step], outputs: set[str], graph) -> None:
    """Decide which buffers each kernel stores and free every buffer after its last reader."""
    readers_outside: dict[str, set[int]] = {}
    for k, step in enumerate(steps):
        for node in step.group.nodes:
            for name in node.read_names:
                readers_outside.setdefault(name, set()).add(k)
    input_names = {name for name, value in graph.inputs if value is not None and hasattr(value, "layout")}
    kept = _keep_in_inputs(steps, outputs, readers_outside)
    for k, step in enumerate(steps):
        step.kept_in_input = kept
        if step.is_extern:
            continue
        for node in step.group.nodes:
            name = node.write_name
            used_elsewhere = any(j != k for j in readers_outside.get(name, ()))
            if name in kept:
                continue
            if name in outputs or name in input_names or used_elsewhere or node.is_scatter or node.fills:
                step.stored.append(name)
    plan_frees(steps, outputs, graph)


def _keep_in_inputs(steps: list[Step], outputs: set[str], readers_outside) -> dict[str, str]:
    """A buffer whose kernel also copies it, unchanged, into a graph input (an optimizer's new
    step count, a running mean) needs no memory of its own: later kernels read the input, which
    no kernel after this one reads for its old value (fusion's order rules). Only where every
    later reader is a kernel (an ATen call would need the buffer by name) and layouts agree.
    Returns {buffer: the input that holds it}."""
    kept: dict[str, str] = {}
    for k, step in enumerate(steps):
        if step.is_extern:
            continue
        made_here = {n.write_name: n for n in step.group.nodes if n.write_name == n.name}
        for node in step.group.nodes:
            source = node.buffer.copy_of
            if source is None or source not in made_here or source in outputs:
                continue
            readers = readers_outside.get(source, set()) - {k}
            if any(j < k or steps[j].is_extern for j in readers):
                continue
            src, dst = made_here[source].buffer.layout, node.buffer.layout
            if (list(src.size), list(src.stride), src.offset) != (list(dst.size), list(dst.stride), dst.offset):
                continue
            kept[source] = node.write_name
    return kept


def plan_frees(steps: list[Step], outputs: set[str], graph) -> None:
    """Free every buffer after its last reader (again, when steps have moved)."""
    input_names = {name for name, value in graph.inputs if value is not None and hasattr(value, "layout")}
    for step in steps:
        step.frees = []
    last_use: dict[str, int] = {}
    kept = {k: v for step in steps for s in [step, *step.combo, *step.finishers] for k, v in s.kept_in_input.items()}
    for k, step in enumerate(steps):
        for node in step.nodes:
            for name in sorted(node.read_names):  # sorted: the frees' order decides reuses (reuse.py)
                last_use[kept.get(name, name)] = k
            if node.write_name != node.name:  # a write into a graph input uses that input too
                last_use[node.write_name] = k
            if node.fills is not None:  # a slice's view lives until written, its storage on
                last_use[node.name] = max(k, last_use.get(node.name, k))
    written = {n for s in steps for m in (s.combo or [s]) for f in [m] + m.finishers
               for n in (f.stored if not f.is_extern else [f.group.nodes[0].write_name])}
    unbound = {n.name for s in steps for n in s.nodes if not n.buffer.binds_name}
    for name, k in last_use.items():
        if name in outputs or name in graph.constants or name in unbound:
            continue
        if name in written or name in input_names or name in graph.shared_storages:
            steps[k].frees.append(name)
    # An ATen call's output nobody reads (an unused part of a multi-output op) dies right away.
    for step in steps:
        name = step.group.nodes[0].write_name
        if step.is_extern and name not in last_use and name not in outputs \
                and step.group.nodes[0].buffer.binds_name:
            step.frees.append(name)
