"""The bytes a schedule holds at each step, as the reorder (memory_order.py) and the combo pass
(combo.py) estimate them: each buffer from the step that allocates it (a donated input from the
first step) through the last step that reads it (a graph output through the last step). Given the
kernels that may write a result over an input dying in them (reuse.py decides, after the order is
fixed), the result takes no memory of its own where its step is that input's last reader."""
from __future__ import annotations


def buffer_sizes(graph) -> dict[str, int | None]:
    """Bytes of each buffer, shared storage and input of an IR graph (None where a size is symbolic)."""
    layouts = {b.name: b.layout for b in graph.buffers if getattr(b, "layout", None) is not None}
    layouts.update({name: s.layout for name, s in getattr(graph, "shared_storages", {}).items()})
    layouts.update({name: v.layout for name, v in graph.inputs if hasattr(v, "layout")})
    return {name: layout.allocated_bytes() for name, layout in layouts.items()}


def live_bytes(allocations: list, reads: list, sizes: dict[str, int], donated, outputs,
               over_inputs: list | None = None) -> list[int]:
    """Bytes alive during each step, for steps that allocate `allocations[k]` and read `reads[k]`
    (names); names without a size are not counted, and every size must be known. over_inputs[k]:
    (result, inputs it may be written over) pairs of step k."""
    start = {name: 0 for name in donated if name in sizes}
    end: dict[str, int] = {}
    for k, (made, read) in enumerate(zip(allocations, reads)):
        for name in made:
            if name in sizes:
                start.setdefault(name, k)
        for name in read:
            end[name] = k
    last_step = len(allocations) - 1

    def last(name):
        return last_step if name in outputs else max(end.get(name, start[name]), start[name])

    block = _blocks(over_inputs or [], start, end, sizes, outputs)
    changes = [0] * (len(allocations) + 1)
    block_last: dict[str, int] = {}
    for name in start:
        owner = block.get(name, name)
        block_last[owner] = max(block_last.get(owner, -1), last(name))
    for owner, final in block_last.items():
        changes[start[owner]] += sizes[owner]
        changes[final + 1] -= sizes[owner]
    live, current = [], 0
    for change in changes[:-1]:
        current += change
        live.append(current)
    return live


def _blocks(over_inputs: list, start: dict, end: dict, sizes: dict, outputs) -> dict[str, str]:
    """{result: the buffer whose memory it takes}, following chains to the first buffer: a result
    goes over an input its step reads last, no smaller, taken by no other result."""
    block: dict[str, str] = {}
    taken: set[str] = set()
    for k, pairs in enumerate(over_inputs):
        for result, inputs in pairs:
            if start.get(result) != k or result in outputs:
                continue
            for name in inputs:
                owner = block.get(name, name)
                if name in taken or name not in start or name in outputs or end.get(name) != k \
                        or sizes[owner] < sizes[result]:
                    continue
                block[result] = owner
                taken.add(name)
                break
    return block
