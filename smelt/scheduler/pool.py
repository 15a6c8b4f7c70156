"""A dead buffer's memory handed to a later buffer of the same size (the wrapper's buffer pool).

Each `torch.empty_strided` of the wrapper is a trip through the caching allocator, a few
microseconds of host time, and GPT-2's training step made about 600 of them: on the H100 that step
is bound by its host (20 ms of wall for 12 of GPU). The caching allocator would hand a freed block
to the next request of its size anyway, so the wrapper can do that itself: when a kernel stores a
buffer of the device, dtype and element count of one that died earlier, it writes `buf9 = buf2`
instead of allocating.

The dead buffer keeps its memory from its death to its taking, where the allocator could have
given it to another request. A taking is accepted only if the graph's planned live bytes, with that
memory held, stay within the planned peak without pooling: the pool never raises the peak.

Only buffers whose memory is wholly theirs take part: allocated by this wrapper (not an ATen
result, whose storage may be larger than its layout says), not a slice of a shared storage, not
passed to an ATen call whose result may alias its inputs (a view of the dead buffer would live on),
not taken over in place (scheduler/reuse.py), and all of static size.
"""
from __future__ import annotations

from ..ir.extern import returns_fresh_buffer
from ..symbolic import static_int
from .reuse import viewed_by_aten


def plan_pool(steps, reuses: dict[str, str], graph, placed: set[str] = frozenset()) -> dict[str, str]:
    """{buffer the wrapper would allocate: the dead buffer whose memory it takes instead}; buffers
    `placed` in the CPU workspace (scheduler/workspace.py) neither take nor give memory."""
    buffers = {b.name: b for b in graph.buffers}
    aliased = viewed_by_aten(steps)
    in_place = set(reuses.values())
    live_bytes: list[int] = []  # planned live bytes after each event, without pooling
    deaths: dict[str, int] = {}  # pool candidates: event index of their death
    wants: list[tuple[int, str]] = []  # (event index of the allocation, buffer) of pool candidates
    mine: set[str] = set()  # pool candidates: allocated by the wrapper, memory wholly theirs
    sizes: dict[str, int] = {}
    # Inputs the graph owns (a backward's saved activations) give their memory back when they die.
    donated = {name: _bytes(getattr(value, "layout", None)) for name, value in graph.inputs
               if name in graph.donated_inputs}
    if None in donated.values():
        return {}
    sizes.update(donated)
    live = sum(donated.values())
    allocated = {name for name, _ in graph.inputs} | set(graph.constants)

    def event(change: int) -> int:
        nonlocal live
        live += change
        live_bytes.append(live)
        return len(live_bytes) - 1

    for step in steps:
        if step.is_extern:
            buffer = step.group.nodes[0].buffer
            if getattr(buffer, "layout", None) is not None and returns_fresh_buffer(buffer):  # a product's output
                size = _bytes(buffer.layout)
                if size is None:
                    return {}
                sizes[buffer.name] = size
                event(size)
        else:
            for name in step.stored + [n for f in step.finishers for n in f.stored]:
                if name in allocated:
                    continue
                allocated.add(name)
                if name in reuses:
                    sizes[name] = sizes.pop(reuses[name], 0)
                    continue
                buffer = buffers[name]
                lives_in = getattr(buffer, "lives_in", None)
                if lives_in is not None:
                    storage = lives_in[0]
                    if storage in allocated:
                        continue
                    allocated.add(storage)
                    buffer = graph.shared_storages[storage]
                    name = storage
                size = _bytes(buffer.layout)
                if size is None:
                    return {}
                sizes[name] = size
                at = event(size)
                if name not in placed and owns_its_memory(buffer, name, aliased, in_place, graph):
                    wants.append((at, name))
                    mine.add(name)
        for name in step.frees:
            size = sizes.pop(name, 0)
            at = event(-size)
            if name in mine:
                deaths[name] = at
    if not live_bytes:
        return {}
    return _take(wants, deaths, live_bytes, buffers)


def _take(wants, deaths, live_bytes, buffers) -> dict[str, str]:
    """Each allocation, in order, takes the latest-dead buffer of its key whose holding keeps the
    live bytes within the peak; the holdings accepted add to the live bytes of later checks."""
    peak = max(live_bytes)
    held = list(live_bytes)
    by_key: dict = {}  # key -> [(event of death, buffer)], in order of death
    for dead, died in sorted(deaths.items(), key=lambda item: item[1]):
        by_key.setdefault(_key(buffers[dead].layout), []).append((died, dead))
    taken: dict[str, str] = {}
    for at, name in wants:
        candidates = by_key.get(_key(buffers[name].layout), [])
        size = _bytes(buffers[name].layout)
        for i in range(len(candidates) - 1, -1, -1):
            died, dead = candidates[i]
            if died < at and max(held[died:at]) + size <= peak:
                for t in range(died, at):
                    held[t] += size
                taken[name] = dead
                del candidates[i]
                break
    return taken


def owns_its_memory(buffer, name: str, aliased: set[str], in_place: set[str], graph) -> bool:
    """Whether `buffer`'s memory is wholly its own (the module docstring's rule): the pool's
    candidates, and the CPU workspace's (scheduler/workspace.py)."""
    layout = getattr(buffer, "layout", None)
    return layout is not None and getattr(buffer, "lives_in", None) is None and buffer.binds_name \
        and getattr(buffer, "storage_name", name) == name and name not in graph.shared_storages \
        and name not in aliased and name not in in_place and static_int(layout.offset) == 0 \
        and _bytes(layout) is not None


def _key(layout):
    return layout.device, layout.dtype, static_int(layout.storage_numel())


def _bytes(layout) -> int | None:
    return None if layout is None else layout.allocated_bytes()
