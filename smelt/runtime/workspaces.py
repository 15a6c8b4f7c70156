"""Scratch buffers a Triton kernel's launcher passes after its arguments: a finisher's ticket
counter (codegen/triton/finisher.py) and a row split's sync and partials buffers
(codegen/triton/row_split.py). Each is allocated once per device and kept zero by the kernel."""
from __future__ import annotations

import torch

from ..artifact import SYNC_HEADER


class TicketCounter:
    """The launcher's side: one int32 counter per device, zeroed once and kept zero by the kernel."""

    def __init__(self):
        self.counters: dict = {}

    def buffer(self, device) -> torch.Tensor:
        counter = self.counters.get(device)
        if counter is None:
            counter = self.counters[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return counter


class RowSplitWorkspace:
    """The launcher's side: the sync buffer (allocated zeroed once per device, kept zero by the
    kernel) and the partials buffer, sized for the rows of each call."""

    def __init__(self, row_split: int, barriers: int, slots: int, xblock: int):
        self.row_split, self.barriers, self.slots, self.xblock = row_split, barriers, slots, xblock
        self.sync: dict = {}
        self.partials: dict = {}
        # Outgrown buffers are kept: a CUDA graph recorded earlier still writes them (runtime/cuda_graphs.py).
        self.outgrown: list = []

    def buffers(self, xnumel: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        groups = -(-xnumel // self.xblock)
        sync_size = SYNC_HEADER + groups * self.barriers
        partial_size = max(1, self.slots * groups * self.xblock * self.row_split)
        sync = self.sync.get(device)
        if sync is None or sync.numel() < sync_size:
            self.outgrown.append(sync)
            sync = self.sync[device] = torch.zeros(sync_size, dtype=torch.int32, device=device)
        partials = self.partials.get(device)
        if partials is None or partials.numel() < partial_size:
            self.outgrown.append(partials)
            partials = self.partials[device] = torch.empty(partial_size, dtype=torch.float32, device=device)
        return sync, partials

    def grid(self, xnumel: int) -> int:
        return -(-xnumel // self.xblock) * self.row_split
