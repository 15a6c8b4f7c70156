"""Independent kernels with one body, gathered into one launch.

An optimizer step (or any loop over a list of tensors) leaves one small kernel per tensor, each
with the same code over different buffers and sizes: hundreds of launches, each too small to
fill the GPU. Kernels whose generated body is the same (the key given by the caller) are moved
together into one step when nothing between them orders them: a kernel joins an earlier group
only if it neither reads what any step since the group's start writes nor writes what those
steps read or write. The group then runs at its first member's place, in one launch
(codegen/triton_combo.py), and the buffers' lifetimes are planned again for the new order.
"""
from __future__ import annotations

from typing import Callable, Hashable

from .schedule import Step, plan_frees

# Members per launch at most: the pointer table grows with them, nothing else does.
MAX_MEMBERS = 1024


def combine(steps: list[Step], key_of: Callable[[Step], Hashable | None], outputs: set[str], graph) -> list[Step]:
    """The steps with kernels of equal keys (None: never combined) gathered into combo steps."""
    placed: list[Step] = []
    open_groups: dict = {}  # key -> [index in placed, names read since, names written since]
    for step in steps:
        reads, writes = _accesses(step)
        key = key_of(step) if not step.is_extern and not step.finishers else None
        joined = False
        if key is not None and key in open_groups:
            index, read_since, written_since = open_groups[key]
            members = placed[index].combo
            if len(members) < MAX_MEMBERS and not reads & written_since and not writes & (read_since | written_since):
                members.append(step)
                joined = True
        if not joined:
            placed.append(Step(step.group, combo=[step]) if key is not None else step)
            if key is not None:
                open_groups[key] = [len(placed) - 1, set(), set()]
            if step.is_extern and _orders_everything(step):
                open_groups.clear()
        for window in open_groups.values():
            window[1] |= reads
            window[2] |= writes
    result = []
    for step in placed:
        if step.combo and len(step.combo) == 1:
            result.append(step.combo[0])
        elif step.combo:
            step.stored = [name for member in step.combo for name in member.stored]
            result.append(step)
        else:
            result.append(step)
    if len(result) != len(steps):
        plan_frees(result, outputs, graph)
    return result


def _accesses(step: Step) -> tuple[set[str], set[str]]:
    reads = set().union(*(n.read_names for n in step.nodes))
    writes = {n.write_name for n in step.nodes} | {n.name for n in step.nodes}
    return reads, writes


def _orders_everything(step: Step) -> bool:
    """An ATen call with effects beyond its output (an assert, .item(), a custom op) stays between
    the kernels before and after it."""
    buffer = step.group.nodes[0].buffer
    return bool(getattr(buffer, "has_side_effects", False)) or not getattr(buffer, "binds_name", True)
