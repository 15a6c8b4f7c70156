"""The bytes a schedule holds at each step, as the reorder (memory_order.py) and the combo pass
(combo.py) estimate them: each buffer from the step that allocates it (a donated input from the
first step) through the last step that reads it (a graph output through the last step)."""
from __future__ import annotations


def buffer_sizes(graph) -> dict[str, int | None]:
    """Bytes of each buffer and input of an IR graph (None where a size is symbolic)."""
    layouts = {b.name: b.layout for b in graph.buffers if getattr(b, "layout", None) is not None}
    layouts.update({name: v.layout for name, v in graph.inputs if hasattr(v, "layout")})
    return {name: layout.allocated_bytes() for name, layout in layouts.items()}


def live_bytes(allocations: list, reads: list, sizes: dict[str, int], donated, outputs) -> list[int]:
    """Bytes alive during each step, for steps that allocate `allocations[k]` and read `reads[k]`
    (names); names without a size are not counted, and every size must be known."""
    start = {name: 0 for name in donated if name in sizes}
    end: dict[str, int] = {}
    for k, (made, read) in enumerate(zip(allocations, reads)):
        for name in made:
            if name in sizes:
                start.setdefault(name, k)
        for name in read:
            end[name] = k
    last_step = len(allocations) - 1
    changes = [0] * (len(allocations) + 1)
    for name, first in start.items():
        last = last_step if name in outputs else max(end.get(name, first), first)
        changes[first] += sizes[name]
        changes[last + 1] -= sizes[name]
    live, current = [], 0
    for change in changes[:-1]:
        current += change
        live.append(current)
    return live
