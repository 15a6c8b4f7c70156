"""Fixed places, in one block kept between calls, for the CPU buffers that live only inside a call.

A CPU buffer the wrapper allocates is fresh memory: glibc gives blocks of that size (megabytes, an
activation) back to the system when a call frees them, and the next call's first write into each
page faults it in again. On the 2-core CPU, MobileNetV3's first batch-norm kernel took 0.37-1.32 ms
a call inside the model against 0.09-0.13 ms on the same tensors alone, and 0.19-0.23 ms in the
call with this workspace (benchmarks/probes/cpu_kernel_times.py). So a CPU graph's buffers that are
allocated by the wrapper, wholly theirs (scheduler/pool.py's rule) and dead before the call returns
get an offset in one workspace of bytes, allocated once per thread (runtime/cpu_workspace.py): the
pages stay faulted in, and a call allocates nothing for them.

In inference graphs, ATen's products take their output buffer (`out=`), so their results get places
too: a fresh [512, 688] result faulted its pages in at every call (Llama's gate and up projections on
the 2-core CPU: 1.12 ms a call against 0.81 for Inductor's, which writes into buffers of its own); and
a buffer a later kernel writes over (scheduler/reuse.py) shares its place with that writer, until the
last of them dies.

Places are packed greedily, largest buffer first, each at the lowest offset no buffer alive at the
same time overlaps: the workspace stays near the planned peak of those buffers, not their sum. It
is held between calls, once per thread that calls the graph (calls on several threads at once get
blocks of their own). SMELT_CPU_WORKSPACE=0: every buffer is allocated at each call.
"""
from __future__ import annotations

import dataclasses

import torch

from .pool import owns_its_memory
from .reuse import viewed_by_aten

ALIGN = 64  # bytes: a cache line, and any dtype's alignment


@dataclasses.dataclass
class WorkspacePlan:
    offsets: dict[str, int]  # buffer -> byte offset in the workspace
    size: int  # bytes


# ATen ops whose `out=` overload the wrapper can call with a workspace buffer (codegen/wrapper.py).
OUT_VARIANTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def writes_into_given_buffer(buffer) -> bool:
    """Whether an ATen call's result can be written into a buffer the wrapper hands it: an op with
    an `out=` overload, whose result is dense rows (as the op would have made it)."""
    op = getattr(buffer, "op", None)
    return isinstance(op, torch._ops.OpOverload) and op._schema.name in OUT_VARIANTS \
        and op._overloadname == "default" and not buffer.kwargs.get("out_dtype") \
        and buffer.layout is not None and buffer.layout.is_contiguous()


def plan_workspace(steps, reuses: dict[str, str], graph, inference: bool = True) -> WorkspacePlan:
    """`inference`: products' results, and buffers a kernel writes over, take places too (a training
    graph's workspace is held through the other graph's calls, where those, activations and their
    gradients, would add to the step's peak)."""
    buffers = {b.name: b for b in graph.buffers}
    aliased = viewed_by_aten(steps)
    allocated = {name for name, _ in graph.inputs} | set(graph.constants)
    born: dict[str, int] = {}  # candidate -> the step that allocates it
    lifetimes: dict[str, tuple[int, int]] = {}

    def first_owner(name: str) -> str:
        while name in reuses:
            name = reuses[name]
        return name

    sharing: dict[str, set[str]] = {}  # a candidate -> the buffers written over it, in turn
    for name in reuses:
        sharing.setdefault(first_owner(name), set()).add(name)
    freed: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.is_extern:
            buffer = step.group.nodes[0].buffer
            if inference and writes_into_given_buffer(buffer) and buffer.layout.device.type == "cpu" \
                    and owns_its_memory(buffer, buffer.name, aliased, set(), graph):
                born[buffer.name] = index
        else:
            for name in step.stored + [n for f in step.finishers for n in f.stored]:
                if name in allocated:
                    continue
                allocated.add(name)
                buffer = buffers.get(name)
                if name in reuses or buffer is None or getattr(buffer, "lives_in", None) is not None:
                    continue
                layout = getattr(buffer, "layout", None)
                if getattr(getattr(layout, "device", None), "type", None) == "cpu" \
                        and owns_its_memory(buffer, name, aliased, set(), graph):
                    born[name] = index
        for name in step.frees:
            freed[name] = index
    for name, first in born.items():
        # What never dies (an output, or a buffer its views keep), itself or a buffer written over it,
        # is allocated at each call.
        members = {name} | sharing.get(name, set())
        if (inference or len(members) == 1) and all(m in freed and m not in aliased for m in members):
            lifetimes[name] = (first, max(freed[m] for m in members))
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
