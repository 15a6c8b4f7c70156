"""Which small reductions run in the last program of the reduction before them (a finisher).

A reduction kernel whose results a small reduction reads next (a split sum's partials, the
per-row results of `x.sum(1).amax()`) can take that small reduction into its own launch: its last
program to finish runs it (codegen/triton/finisher.py prints that). Here is only the pairing:
which steps qualify, in which order, and the steps merged. The backend says which kernels can
run finishers at all (`eligible`: Triton's, unless a row split already uses their sync buffer).
"""
from __future__ import annotations

from ..symbolic import static_int
from .schedule import Step

# Elements the finishing program reduces at most (config.finish_limit's default): a global sum's
# 16384 partials (lowering's ROW_TARGET_PROGRAMS) fit; a column sum's [16, 4096] partials do not,
# and stay a second kernel. Not yet measured above it: at 65536 EfficientNet-B0's inference would
# launch 9 kernels fewer (its squeeze-excite gates' pools and products), one program doing each.
FINISH_LIMIT = 16384
# Bytes per FINISH_LIMIT element a finisher may read besides the results of the kernels before
# it: a small product's weight and bias (a squeeze-excite gate's, after its pool), not a gather
# from a big tensor.
OTHER_READ_BYTES = 4


def attach_finishers(steps: list[Step], eligible=lambda step: True, sizes=None, limit=None) -> list[Step]:
    """The steps, each reduction kernel followed by small reductions of its results made one step
    whose `finishers` are those small reductions (in order: a later one may read an earlier one's).
    Only steps whose kernel `eligible` says can run finishers (its backend's answer) take part.
    `sizes`: bytes of buffers by name (live_bytes.buffer_sizes), for what else a finisher reads;
    `limit`: FINISH_LIMIT unless given (the setting)."""
    finishing = finisher_plan(steps, eligible, sizes, limit)
    merged: list[Step] = []
    for step in steps:
        big = finishing.get(id(step))
        if big is not None:  # the step just before it in `merged`
            big.finishers.append(step)
            big.frees = big.frees + step.frees
            continue
        merged.append(step)
    return merged


def finisher_plan(steps: list[Step], eligible=lambda step: True, sizes=None, limit=None) -> dict[int, Step]:
    """Which step each small reduction would finish in (id of the small step -> the big step), for
    the steps in this order; nothing is changed."""
    finishing: dict[int, Step] = {}
    finishers: dict[int, list[Step]] = {}  # big step's id -> the small steps it takes
    before = None
    for step in steps:
        if before is not None and not step.is_extern and not before.is_extern and eligible(before) \
                and can_finish(before, step, finishers.get(id(before), []), sizes, limit):
            finishers.setdefault(id(before), []).append(step)
            finishing[id(step)] = before
            continue
        before = step
    return finishing


def written_in_launch(steps: list[Step]) -> frozenset[str]:
    """What these steps (a big kernel and its finishers so far) write: their stored buffers and
    the shared storages their slices fill (a cat's), which a reader loads by the storage's name.
    A finisher reads them through L2 (codegen/triton/finisher.py); anything else it reads was
    stored before the launch."""
    return frozenset(name for step in steps for name in step.stored).union(
        n.fills for step in steps for n in step.group.nodes if n.fills and n.name in step.stored)


def can_finish(big: Step, small: Step, finishers: list[Step] | None = None, sizes=None, limit=None) -> bool:
    """Whether `small` can run in `big`'s last program, after the small steps `finishers` (by
    default big's own) already do. What it reads besides their results was stored before `big`'s
    launch (steps run in order); with `sizes` (bytes by name) it may read up to OTHER_READ_BYTES
    per element of the limit of such buffers, without them nothing."""
    limit = FINISH_LIMIT if limit is None else limit
    other_reads = OTHER_READ_BYTES * limit
    finishers = big.finishers if finishers is None else finishers
    if big.is_extern or small.is_extern or small.finishers or big.combo or small.combo:
        return False
    if not big.group.is_reduction or not small.group.is_reduction:
        return False
    ready = written_in_launch([big, *finishers])
    other = small.group.read_names() - small.group.names - ready
    if not (ready & small.group.read_names()):
        return False  # not a reduction of the big kernel's results at all
    if other and (sizes is None or sum(sizes.get(name) or other_reads + 1 for name in other) > other_reads):
        # A reduction of the big kernel's results and little else. Measured on an H100: cross
        # entropy's loss over rows (a gather per row from the logits) finished by the last program
        # took 0.248 ms, 0.236 with the gather as the row kernel's epilogue, against 0.223 as a
        # second kernel.
        return False
    nodes = big.group.nodes + small.group.nodes
    if any(n.is_scatter or n.is_scan or n.write_name != n.name for n in nodes):
        return False  # scans and in-place writes keep their own kernels
    if big.group.nodes[0].buffer.get_device() != small.group.nodes[0].buffer.get_device():
        return False
    xn, rn = static_int(small.group.xnumel), static_int(small.group.rnumel)
    if xn is None or rn is None or xn * rn > limit:
        return False
    return bool(static_int(big.group.xnumel))  # a launch of no programs would leave it unrun
