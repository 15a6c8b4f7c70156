"""Fixed places, in one block kept between calls, for the CPU buffers that live only inside a call.

A CPU buffer the wrapper allocates is fresh memory: glibc gives blocks of that size (megabytes, an
activation) back to the system when a call frees them, and the next call's first write into each
page faults it in again. On the 2-core CPU, MobileNetV3's first batch-norm kernel took 0.37-1.32 ms
a call inside the model against 0.09-0.13 ms on the same tensors alone, and 0.19-0.23 ms in the
call with this workspace (benchmarks/probes/cpu_kernel_times.py). So a CPU graph's buffers that are
allocated by the wrapper, wholly theirs (scheduler/pool.py's rule) and dead before the call returns
get an offset in one workspace of bytes, allocated once per thread (runtime/cpu_workspace.py): the
pages stay faulted in, and a call allocates nothing for them.

Places are packed greedily, largest buffer first, each at the lowest offset no buffer alive at the
same time overlaps: the workspace stays near the planned peak of those buffers, not their sum. It
is held between calls, once per thread that calls the graph (calls on several threads at once get
blocks of their own). SMELT_CPU_WORKSPACE=0: every buffer is allocated at each call.
"""
from __future__ import annotations

import dataclasses

from .pool import owns_its_memory
from .reuse import viewed_by_aten

ALIGN = 64  # bytes: a cache line, and any dtype's alignment


@dataclasses.dataclass
class WorkspacePlan:
    offsets: dict[str, int]  # buffer -> byte offset in the workspace
    size: int  # bytes


def plan_workspace(steps, reuses: dict[str, str], graph) -> WorkspacePlan:
    buffers = {b.name: b for b in graph.buffers}
    aliased = viewed_by_aten(steps)
    in_place = set(reuses.values())
    allocated = {name for name, _ in graph.inputs} | set(graph.constants)
    born: dict[str, int] = {}  # candidate -> the step that allocates it
    lifetimes: dict[str, tuple[int, int]] = {}
    for index, step in enumerate(steps):
        if not step.is_extern:
            for name in step.stored + [n for f in step.finishers for n in f.stored]:
                if name in allocated:
                    continue
                allocated.add(name)
                buffer = buffers.get(name)
                if name in reuses or buffer is None or getattr(buffer, "lives_in", None) is not None:
                    continue
                layout = getattr(buffer, "layout", None)
                if getattr(getattr(layout, "device", None), "type", None) == "cpu" \
                        and owns_its_memory(buffer, name, aliased, in_place, graph):
                    born[name] = index
        for name in step.frees:
            if name in born:
                lifetimes[name] = (born.pop(name), index)
    # What never dies (an output, or a buffer its views keep) is allocated at each call.
    return _pack({name: buffers[name].layout.allocated_bytes() for name in lifetimes}, lifetimes)


def _pack(sizes: dict[str, int], lifetimes: dict[str, tuple[int, int]]) -> WorkspacePlan:
    placed: list[tuple[int, int, tuple[int, int]]] = []  # (offset, end, lifetime)
    offsets: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], lifetimes[n])):
        first, last = lifetimes[name]
        size = -(-sizes[name] // ALIGN) * ALIGN
        busy = sorted((start, end) for start, end, (f, l) in placed if f <= last and first <= l)
        offset = 0
        for start, end in busy:
            if offset + size <= start:
                break
            offset = max(offset, end)
        offsets[name] = offset
        placed.append((offset, offset + size, (first, last)))
    return WorkspacePlan(offsets, max((end for _, end, _ in placed), default=0))
