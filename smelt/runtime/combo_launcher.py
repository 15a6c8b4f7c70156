"""Launches a combo kernel (codegen/triton/combo.py): builds its work and pointer tables.

The work table (kind, offset of the member's row in the pointer table, block) per program depends
only on the members' static sizes and kinds: made once per device, biggest members first so that
the small ones fill the last wave. The pointer table holds each member's buffer addresses and
sizes (xnumel, and rnumel for a reduction), one row per member. On the GPU it stays where it is,
one per stream, and is written again only when the buffers moved (those the graph allocates may
move every call; an optimizer's parameters and states stay put), by a kernel that takes its
values as arguments (table_writer.py), in stream order before the combo kernel reads it. While a
CUDA graph records, and where the writer does not compile, tables are copied from pinned memory
instead, kept per distinct set of addresses; on the CPU they are host tensors.

Host scalars (a learning rate passed as a CPU tensor, read once by the wrapper) come after the
buffers and are passed to the kernel as they are, after its two tables.

The kernel's loads through the table are vectorized only in its binary for buffers all 16-byte
aligned (POINTER_ALIGN=16, what block_constants gives); a call with any buffer off that (a view at an
odd offset, a parameter in a flat buffer) launches the binary compiled with POINTER_ALIGN=1.

With autotuning on, the first call times the launch's candidate configs (its pointwise kinds'
XBLOCK and num_warps) as whole launches, and the choice is cached on disk like a kernel's.
"""
from __future__ import annotations

import functools
import logging
import operator
import threading

import torch

from .table_writer import table_length

log = logging.getLogger("smelt.runtime")
_data_ptr = torch.Tensor.data_ptr
# Pointer tables kept per combo kernel: enough for a few alternating buffer sets.
MAX_TABLES = 8
# Pinned staging buffers a launcher cycles through when its buffers move every call.
STAGING = 4
# What every launch of a combo kernel passes, as cuda_binary.describe gives it: its int32 work
# table and int64 pointer table (_work_table; _pointer_table or a written table), torch allocations.
LAUNCH_DESCRIPTION = (("ptr", "torch.int32", True), ("ptr", "torch.int64", True))


def launch_description(scalars: int) -> tuple:
    """A combo launch's arguments described: the tables, then its host scalars (float64 values)."""
    return LAUNCH_DESCRIPTION + (("fp64",),) * scalars


class ComboLauncher:
    def __init__(self, launcher, member_sizes: list[tuple[int, ...]], member_kinds: list[int],
                 pointers_per_kind: list[int], xblock_per_kind: list[int], written_per_kind: list[tuple[int, ...]],
                 scalars: int = 0, autotuner=None, writer=None):
        self.launcher = launcher  # a TritonLauncher for the combo kernel, with a fixed grid (aligned buffers)
        self.unaligned = None  # the same kernel for buffers not all 16-byte aligned, made on first need
        self.sizes = member_sizes
        self.kinds = member_kinds
        self.xblock_per_kind = xblock_per_kind
        self.pointers = [pointers_per_kind[k] for k in member_kinds]  # each member's
        self.scalars = scalars  # host scalars after the buffers in a call's arguments
        # Where each member's row starts in the pointer table, and its buffers in the call's arguments.
        self.rows = [0]
        for n, sizes in zip(self.pointers, self.sizes):
            self.rows.append(self.rows[-1] + n + len(sizes))
        # Positions, among a call's buffers, of those some member stores through.
        self.written = []
        at = 0
        for k in member_kinds:
            self.written += [at + j for j in written_per_kind[k]]
            at += pointers_per_kind[k]
        self.autotuner = autotuner  # times the candidate configs on the first call, then dropped
        self.writer = writer  # a table_writer.TableWriter, or None: tables copied from pinned memory
        self.written_tables: dict = {}  # (device, stream) -> [its table, the addresses last written there, aligned]
        self.lock = threading.Lock()  # a table's write and the launch reading it, from one thread at a time
        self.blocks = self.blocks_of(member_sizes, member_kinds, xblock_per_kind, launcher.config.XBLOCK)
        self.work: dict = {}
        self.tables: dict = {}  # (device, addresses) -> (pointer table, whether the addresses are aligned)
        self.kept_for_graphs: list = []  # tables CUDA graphs read (runtime/cuda_graphs.py)
        self.side_stream = None  # where those tables are written
        self.staging: list = []  # (pinned int64 tensor, CUDA event recorded after its copy)
        self.next_staging = 0

    @property
    def variants(self):
        return self.launcher.variants

    @staticmethod
    def blocks_of(member_sizes, member_kinds, xblock_per_kind, xblock: int) -> list[int]:
        """Programs each member runs: its x blocks at its kind's XBLOCK, or the launch's `xblock`
        for a pointwise kind (listed as 0)."""
        return [-(-sizes[0] // (xblock_per_kind[k] or xblock)) for sizes, k in zip(member_sizes, member_kinds)]

    @classmethod
    def programs(cls, launch: tuple, xblock: int) -> int:
        """The grid of a combo kernel, from its `launch` (codegen/triton/combo.py)."""
        member_sizes, member_kinds, _, xblock_per_kind, _, _ = launch
        return sum(cls.blocks_of(member_sizes, member_kinds, xblock_per_kind, xblock))

    def __call__(self, *args):
        if self.scalars:
            buffers, scalars = args[:-self.scalars], args[-self.scalars:]
        else:
            buffers, scalars = args, ()
        device = buffers[0].device
        if self.autotuner is not None:
            self._tune(buffers, scalars, device)
        work = self.work.get(device)
        if work is None:
            work = self.work[device] = self._work_table(device, self.blocks)
        addresses = tuple(map(_data_ptr, buffers))  # map: no generator frame per call (hundreds of buffers)
        # A table is kept with whether its buffers are all aligned: checked where it is made or
        # written again, not on every call (600 addresses compared cost an Adam step 24 us).
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            table, aligned = self.tables.get((device, addresses)) or \
                (self._table_while_recording(addresses, device), _aligned(addresses))
            self.kept_for_graphs.append(table)  # a recording reads it on every replay: never freed
        elif self.writer is not None:
            self._launch_written(work, addresses, device, scalars)
            return
        else:
            kept = self.tables.get((device, addresses))
            if kept is None:
                if len(self.tables) >= MAX_TABLES:
                    self.tables.clear()
                kept = self.tables[(device, addresses)] = (self._pointer_table(addresses, device), _aligned(addresses))
            table, aligned = kept
        self._launcher_for(aligned)(work, table, *scalars)

    def _launcher_for(self, aligned: bool):
        """The launcher of the binary for buffers all 16-byte aligned, or for any."""
        if aligned:
            return self.launcher
        if self.unaligned is None:
            self.unaligned = self.launcher.with_constants(POINTER_ALIGN=1)
        return self.unaligned

    def _launch_written(self, work, addresses: tuple[int, ...], device, scalars: tuple) -> None:
        """Launches with this stream's table, written first where its buffers moved."""
        stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else None
        with self.lock:
            held = self.written_tables.get((device, stream))
            if held is None:
                held = self._new_written_table(device, stream)
                if held is None:  # no writer on this machine: tables copied from now on
                    self._launcher_for(_aligned(addresses))(work, self._pointer_table(addresses, device), *scalars)
                    return
            if held[1] != addresses:
                self.writer.write(held[0], self._table_values(addresses))
                held[1], held[2] = addresses, _aligned(addresses)
            self._launcher_for(held[2])(work, held[0], *scalars)

    def _new_written_table(self, device, stream) -> list | None:
        try:
            self.writer.prepare(self.rows[-1], device)
        except Exception as e:  # noqa: BLE001 - any failure to build the writer: the copied tables are always right
            log.warning("smelt: %s copies its pointer tables: their writer did not build (%s: %s)",
                        self.launcher.name, type(e).__name__, e)
            self.writer = None
            return None
        table = torch.zeros(table_length(self.rows[-1]), dtype=torch.int64, device=device)
        held = self.written_tables[(device, stream)] = [table, None, True]  # its addresses, whether aligned
        return held

    def _tune(self, buffers, scalars, device) -> None:
        """Times the candidate configs as whole launches (or reads the choice from disk) and keeps
        the fastest. The trials store into copies of the written buffers: a combo that updates its
        inputs in place (an optimizer's) would otherwise apply its update once per trial."""
        tuner, self.autotuner = self.autotuner, None
        key = (tuple(self.sizes), tuple(self.kinds))
        config = tuner.known(key, device)  # chosen before: no copies, no trials
        if config is None:
            config = self._time_candidates(tuner, key, buffers, scalars, device)
        if config is not None:
            self.blocks = self.blocks_of(self.sizes, self.kinds, self.xblock_per_kind, config.XBLOCK)
            self.work.clear()
            self.launcher.reconfigure(config, sum(self.blocks))
            if self.unaligned is not None:
                self.unaligned.reconfigure(config, sum(self.blocks))

    def _time_candidates(self, tuner, key, buffers, scalars, device):
        """The fastest candidate, timed on copies of the written buffers; None where they do not fit."""
        written = [buffers[i] for i in self.written]
        needed = sum(b.numel() * b.element_size() for b in written)
        if device.type == "cuda" and needed > torch.cuda.mem_get_info(device)[0] // 2:
            log.info("smelt: %s is not autotuned: copies of the %.0f MB it writes would not fit",
                     self.launcher.name, needed / 1e6)
            return None
        scratch = list(map(_data_ptr, buffers))
        copies = []  # alive until the trials end: the table points into them
        for i, b in zip(self.written, written):
            copy = torch.empty_strided(b.size(), b.stride(), dtype=b.dtype, device=b.device).copy_(b)
            copies.append(copy)
            scratch[i] = copy.data_ptr()
        table = self._pointer_table(tuple(scratch), device)
        launcher = self._launcher_for(_aligned(scratch))
        prepared = {}

        def run(config):
            shape = (config.XBLOCK, config.num_warps)
            if shape not in prepared:
                blocks = self.blocks_of(self.sizes, self.kinds, self.xblock_per_kind, config.XBLOCK)
                prepared[shape] = self._work_table(device, blocks), sum(blocks)
            work, programs = prepared[shape]
            launcher.reconfigure(config, programs)
            launcher(work, table, *scalars)

        return tuner.pick(key, device, run)

    def _work_table(self, device, blocks: list[int]) -> torch.Tensor:
        blocks = torch.tensor(blocks, dtype=torch.int64)
        order = torch.argsort(blocks, descending=True, stable=True)
        members = torch.repeat_interleave(order, blocks[order])
        starts = torch.cumsum(blocks[order], 0) - blocks[order]
        block = torch.arange(len(members)) - torch.repeat_interleave(starts, blocks[order])
        kinds = torch.tensor(self.kinds, dtype=torch.int64)[members]
        rows = torch.tensor(self.rows[:-1], dtype=torch.int64)[members]
        return torch.stack([kinds, rows, block], 1).to(torch.int32).contiguous().to(device)

    def _table_values(self, addresses: tuple[int, ...]) -> list[int]:
        rows = []
        at = 0
        for sizes, count in zip(self.sizes, self.pointers):
            rows.extend(addresses[at:at + count])
            rows.extend(sizes)
            at += count
        return rows

    def _table_rows(self, addresses: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(self._table_values(addresses), dtype=torch.int64)

    def _table_while_recording(self, addresses: tuple[int, ...], device) -> torch.Tensor:
        """The table for a launch a CUDA graph is recording (runtime/cuda_graphs.py): written now,
        on a stream that is not recording, outside the graph's memory, so that every replay reads
        these addresses (a copy recorded from a staging buffer would replay whatever later calls
        left there). The recording waits for the copy before its first replay."""
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream(device)
        pinned = self._table_rows(addresses).pin_memory()  # torch copies only pinned memory while recording
        self.kept_for_graphs.append(pinned)  # until the copy is done: the recording synchronizes
        with torch.cuda.stream(self.side_stream):
            return pinned.to(device, non_blocking=True)

    def _pointer_table(self, addresses: tuple[int, ...], device) -> torch.Tensor:
        table = self._table_rows(addresses)
        if device.type != "cuda":
            return table
        # Copied from pinned memory without waiting on the GPU's queue; a staging buffer is
        # written again only once its last copy is done (long before, in practice).
        if len(self.staging) < STAGING:
            self.staging.append((torch.empty(len(table), dtype=torch.int64, pin_memory=True), torch.cuda.Event()))
        pinned, copied = self.staging[self.next_staging]
        self.next_staging = (self.next_staging + 1) % STAGING
        copied.synchronize()
        pinned.copy_(table)
        on_device = torch.empty(len(table), dtype=torch.int64, device=device)
        on_device.copy_(pinned, non_blocking=True)
        copied.record()
        return on_device


def _aligned(addresses) -> bool:
    """Whether every address is a multiple of 16 bytes."""
    return not functools.reduce(operator.or_, addresses, 0) & 15
