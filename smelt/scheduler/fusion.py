"""Fused groups: which loop nests run in one kernel, and the checks that make that legal.

A kernel iterates an (xnumel, rnumel) space. Each member node is placed in it as a reduction
(one output per x, reducing over r), a scan (one output per (x, r), combining along r), an `xr`
loop (one element per (x, r)) or an `x` loop (one element per x). A member that reads a buffer
another member writes must read exactly the element written at the same (x, r) point; then the
value is passed in registers and never goes to memory.
"""
from __future__ import annotations

import sympy

from .nodes import SchedulerNode, same
from .placement import ROW_VALUED, Placement


class FusedGroup:
    def __init__(self, node: SchedulerNode):
        self.nodes: list[SchedulerNode] = [node]
        self.xnumel = None if node.is_extern else node.numel()
        self.rnumel = None if node.is_extern else node.reduction_numel()

    @property
    def is_reduction(self) -> bool:
        """Whether the kernel has an r axis: some member reduces or scans over it."""
        return any(n.is_reduction or n.is_scan for n in self.nodes)

    @property
    def is_extern(self) -> bool:
        return self.nodes[0].is_extern

    @property
    def names(self) -> set[str]:
        return {n.write_name for n in self.nodes}

    def read_names(self) -> set[str]:
        return set().union(*(n.read_names for n in self.nodes))

    def placements(self) -> dict[str, Placement]:
        return {n.name: n.placement(self.xnumel, self.rnumel) for n in self.nodes}

    def __repr__(self):
        return f"FusedGroup({', '.join(n.name for n in self.nodes)} | {self.xnumel} x {self.rnumel})"


# Loads per element from which a pointwise node stays out of a reduction's kernel. Pointwise
# kernels shrink their blocks by their loads (codegen's _block_shrink, from 24); a reduction keeps
# its full block, so a 5x5 depthwise window (54 loads) summed inside a squeeze-excite mean held
# 54 loads per element in flight over the whole block (windows inside such means ran slower than
# cuDNN's, RESULTS seventh session; MobileNetV3's longest sm_90 build 1.31 -> 1.04 s split).
# Alone, the window gets its shrunk block and the reduction reads its stored output.
HEAVY_LOADS = 24


def _heavy(node: SchedulerNode) -> bool:
    return not (node.is_reduction or node.is_scan) and len(node.reads) >= HEAVY_LOADS


def shape_with(group: FusedGroup, node: SchedulerNode):
    """The (xnumel, rnumel) of group plus node, or None when their iteration spaces differ."""
    if group.is_extern or node.is_extern:
        return None
    if node.numel() == 0 or group.xnumel * group.rnumel == 0:
        return None  # an empty tensor's kernel never launches; it has nothing to share
    if node.is_reduction or node.is_scan:
        x, r = node.numel(), node.reduction_numel()
        if group.is_reduction:
            return (x, r) if same(x, group.xnumel) and same(r, group.rnumel) else None
        if any(_heavy(n) for n in group.nodes):
            return None
        # A pointwise group becomes the xr-part of this reduction when its numel matches.
        return (x, r) if all(n.placement(x, r) for n in group.nodes) else None
    if group.is_reduction and _heavy(node):
        return None
    if node.placement(group.xnumel, group.rnumel):
        return group.xnumel, group.rnumel
    return None


def dependencies_line_up(nodes: list[SchedulerNode], xnumel, rnumel) -> bool:
    """True when every read of a buffer written inside the kernel is of the element written there."""
    writers = {n.write_name: n for n in nodes}
    placement = {n.name: n.placement(xnumel, rnumel) for n in nodes}
    if any(p is None for p in placement.values()):
        return False
    for node in nodes:
        for name, index in node.reads_in_kernel(placement[node.name], xnumel, rnumel):
            producer = writers.get(name)
            if producer is None or producer is node:
                continue
            if producer.position > node.position:
                # A later member overwrites what this one reads (an input mutation): safe only when
                # each program reads an element before it writes that same element.
                written = producer.store_index(placement[producer.name], xnumel, rnumel)
                if not _same_index(written, index) or placement[node.name] != placement[producer.name]:
                    return False
                continue
            produced_at = placement[producer.name]
            if produced_at in ROW_VALUED and placement[node.name] == Placement.X:
                return False  # an x loop cannot see values made per (x, r)
            written = producer.store_index(produced_at, xnumel, rnumel)
            if not _same_index(written, index):
                return False
    return True


def _same_index(a, b) -> bool:
    return a == b or sympy.expand(a - b) == 0  # equal as written is the common case, and free


def scatter_target_untouched(group: FusedGroup, node: SchedulerNode) -> bool:
    """A scatter writes elements that other programs of its kernel may be reading or writing, so
    nothing else in the kernel may touch its target: not the writer it follows, not a reader."""
    for member in group.nodes:
        for scatter, other in ((member, node), (node, member)):
            if scatter.is_scatter and (scatter.write_name in other.read_names or scatter.write_name == other.write_name):
                return False
    return True


def can_fuse(group: FusedGroup, node: SchedulerNode):
    """The new kernel shape if node may join group, else None."""
    shape = shape_with(group, node)
    if shape is None or not scatter_target_untouched(group, node):
        return None
    if group.nodes[0].buffer.get_device() != node.buffer.get_device():
        return None
    if not dependencies_line_up(group.nodes + [node], *shape):
        return None
    return shape
