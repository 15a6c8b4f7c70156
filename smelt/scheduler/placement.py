"""Where a member's values live in a kernel of shape (xnumel, rnumel)."""
from __future__ import annotations

import enum


class Placement(str, enum.Enum):
    """A member of an (x, r) kernel computes one of these (the scheduler places each member once,
    scheduler/nodes.py `SchedulerNode.placement`; printers read it from the kernel plan)."""

    X = "x"  # one value per x: a pointwise node of the kernel's outputs, before or after its rows
    XR = "xr"  # one value per (x, r) point: a pointwise node over the rows, read along r
    REDUCTION = "reduction"  # one value per x, reduced over that row's r
    SCAN = "scan"  # one value per (x, r), accumulated along r

    def __str__(self) -> str:  # kernel comments and schedule dumps print the short name
        return self.value

    __format__ = str.__format__


ROW_VALUED = (Placement.XR, Placement.SCAN)  # a value per (x, r): a 2-D block in a kernel
IN_ROW_LOOP = (Placement.XR, Placement.REDUCTION, Placement.SCAN)  # computed inside the loop over r
