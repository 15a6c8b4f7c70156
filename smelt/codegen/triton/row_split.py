"""Rows too long for one program's registers, kept in the registers of several programs.

A softmax over rows of 256k elements needs each row's max and sum before it can write anything.
One program per row cannot hold the row, so it reads the row again for every pass (three reads
and a write where the floor is one of each). Here each row is split into ROW_SPLIT chunks, one
program per chunk, each holding its chunk in registers for the whole kernel. A reduction becomes:
every program reduces its chunk, stores the partial, waits at a barrier until all programs of its
row have stored theirs, then reads all ROW_SPLIT partials and combines them. The input is read
once and the output written once.

A barrier across programs is only safe while every program it waits for is running or can start.
Programs take their place (row, chunk) from a ticket counter in the order they start, not from
program_id: every ticket below a running program's belongs to a program that has started, so a
row whose tickets are all handed out always completes, and a waiting row only needs ROW_SPLIT
programs resident at once. ROW_SPLIT is capped well below the number of programs an H100 keeps
resident. The interpreter runs programs one after another, so interpreted kernels never split.

The sync buffer (int32, zero between launches) holds the ticket counter, a finished counter and
one arrival counter per (row group, barrier); the last program to finish zeroes it again.
"""
from __future__ import annotations

import torch

from ...artifact import SYNC_HEADER
from ...ir.reduction_kinds import kind
from ...scheduler.placement import Placement
from ...symbolic import next_power_of_2
from ..common import CSEVar, register_dtype
from .ops import EXP

# A chunk per program: 8192 float32 values are 32 registers a thread at 8 warps.
CHUNK = 8192
WARPS = 8  # 4 to 16 warps and chunks of 4k to 32k elements measured within 5% of each other
# At most this many programs cooperate on a row; an H100 keeps hundreds resident.
MAX_ROW_SPLIT = 64
# Rows enough to keep an H100 busy with one program each (132 SMs, about 4 resident apiece): a
# looped kernel then reads each row back from L2 while the split's barriers only cost. Measured on
# the H200: GPT-2's cross-entropy backward, 4096 rows of 50,257, took 1.06 ms split against
# Inductor's 0.43 looped; a softmax over 256 rows of 262,144 0.236 split against 0.407.
MAX_SPLIT_ROWS = 512


def row_split_for(plan, interpret: bool, persistent_limit: int) -> int:
    """Programs per row for this kernel, or 1 (no split)."""
    xn, rn = plan.static_sizes()
    if interpret or not plan.is_reduction or plan.has_scan or xn is None or rn is None:
        return 1
    if rn <= persistent_limit or rn > CHUNK * MAX_ROW_SPLIT or xn > MAX_SPLIT_ROWS:
        return 1
    if not any(plan.phase[n.name] > 0 and plan.placement[n.name] == Placement.XR for n in plan.nodes):
        return 1  # nothing reads the row after a reduction: a looped pass reads it once anyway
    for node in plan.nodes:
        if node.is_scatter:
            return 1
        if node.is_reduction:
            if not kind(node.data.reduction_type).row_combinable or register_dtype(node.data.src_dtype) != torch.float32:
                return 1
    return -(-rn // CHUNK)


class RowSplit:
    """Emits the ticket prologue, the partial exchanges and the sync-buffer reset of one kernel."""

    def __init__(self, kernel, row_split: int):
        self.k = kernel
        self.row_split = row_split
        self.barriers = 0  # arrival counters per row group
        self.slots = 0  # partial values exchanged per row

    def prologue(self, out) -> None:
        out.writeline("# Place (row group, chunk) by arrival order: see smelt/codegen/triton/row_split.py.")
        out.writeline("ticket = tl.atomic_add(sync_ptr, 1, sem='relaxed')")
        out.writeline("row_group = ticket // ROW_SPLIT")
        out.writeline("rchunk = ticket % ROW_SPLIT")
        out.writeline("xoffset = row_group * XBLOCK")

    def rindex_line(self) -> str:
        return "rindex = rchunk * RBLOCK + rbase"

    def exchange(self, rtype: str, local: tuple[CSEVar, ...]) -> tuple[CSEVar, ...]:
        """The row's reduction from this program's partial results `local` (each [XBLOCK, 1]):
        all of them are stored, then one barrier, then each row's partials are combined."""
        k = self.k
        dtype = register_dtype(local[0].dtype)
        barrier = self.barriers
        self.barriers += 1
        body = k.body
        bases = []
        for value in local:
            bases.append(f"partials_ptr + {self.slots} * tl.cdiv(xnumel, XBLOCK) * XBLOCK * ROW_SPLIT")
            self.slots += 1
            body.writeline(f"tl.store({bases[-1]} + xindex * ROW_SPLIT + rchunk, {value})")
        counter = f"sync_ptr + {SYNC_HEADER} + row_group * {{barriers}} + {barrier}"
        body.writeline("tl.debug_barrier()")  # every thread's partial is written before the release
        body.writeline(f"arrived = tl.atomic_add({counter}, 1, sem='acq_rel') + 1")
        body.writeline("while arrived < ROW_SPLIT:")
        body.writeline(f"    arrived = tl.atomic_add({counter}, 0, sem='acquire')")
        lanes = f"tl.arange(0, {next_power_of_2(self.row_split)})[None, :]"
        mask = f"{lanes} < ROW_SPLIT" + (" & xmask" if k.need_xmask else "")

        def load(base, fill):
            # .cg: read through L2, never a line this SM's L1 cached before the partials were final.
            return k.emit(f"tl.load({base} + xindex * ROW_SPLIT + {lanes}, {mask}, other={fill}, "
                          f"cache_modifier='.cg')", dtype, 2)

        if rtype == "online_softmax_reduce":
            maxes, sums = load(bases[0], 'float("-inf")'), load(bases[1], "0.0")
            row_max = k.emit(f"tl.reduce({maxes}, 1, {k._combine_name('max', dtype)})[:, None]", dtype, 1)
            # A chunk of only -inf holds (-inf, NaN): it adds nothing.
            rescale = EXP.format(f"{maxes} - {row_max}")
            terms = k.emit(f'tl.where({maxes} == float("-inf"), 0.0, {sums} * {rescale})', dtype, 2)
            total = k.emit(f"tl.sum({terms}, 1)[:, None]", dtype, 1)
            return row_max, k.emit(f'tl.where({row_max} == float("-inf"), float("nan"), {total})', dtype, 1)
        (base,) = bases
        parts = load(base, {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}[rtype])
        if rtype == "sum":
            return (k.emit(f"tl.sum({parts}, 1)[:, None]", dtype, 1),)
        return (k.emit(f"tl.reduce({parts}, 1, {k._combine_name(rtype, dtype)})[:, None]", dtype, 1),)

    def epilogue(self, out) -> None:
        out.writeline("# The last program to finish zeroes the sync buffer for the next launch.")
        # Relaxed: every counter this program touched has already answered it, and nothing else
        # needs ordering; a release here would wait for the chunk's stores (3% of the kernel).
        out.writeline("finished = tl.atomic_add(sync_ptr + 1, 1, sem='relaxed')")
        out.writeline("if finished == tl.num_programs(0) - 1:")
        out.writeline(f"    for start in range(0, {SYNC_HEADER} + tl.cdiv(xnumel, XBLOCK) * {self.barriers}, 1024):")
        out.writeline("        clear = start + tl.arange(0, 1024)")
        out.writeline(f"        tl.store(sync_ptr + clear, tl.zeros([1024], tl.int32), "
                      f"clear < {SYNC_HEADER} + tl.cdiv(xnumel, XBLOCK) * {self.barriers})")

    def finish(self, source: str) -> str:
        return source.replace("{barriers}", str(self.barriers))

