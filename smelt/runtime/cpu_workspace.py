"""The block a CPU graph's call-local buffers live in (scheduler/workspace.py): allocated on a
thread's first call of the graph, carved into the buffers' views once, and kept for that thread's
later calls, so a call neither allocates them nor faults their pages in again."""
from __future__ import annotations

import threading

import torch


class CpuWorkspace:
    def __init__(self, size: int, buffers: list[tuple[int, tuple, tuple, torch.dtype]]):
        self.size = size
        self.layouts = buffers  # (byte offset, size, stride, dtype) of each buffer, in the wrapper's order
        self._local = threading.local()

    def buffers(self) -> list[torch.Tensor]:
        made = getattr(self._local, "buffers", None)
        if made is None:
            block = torch.empty(self.size, dtype=torch.uint8)
            made = []
            for offset, size, stride, dtype in self.layouts:
                extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
                nbytes = extent * dtype.itemsize
                made.append(block[offset:offset + nbytes].view(dtype).as_strided(size, stride))
            self._local.buffers = made
        return made
