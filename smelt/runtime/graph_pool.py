"""The memory pool CUDA graph recordings share on one device (runtime/cuda_graphs.py), and the caching
allocator's view of it.

A capture allocates from the pool; what it allocates is what its replays write. So what a capture
may take is whatever the allocator sees free in the pool then, and that must be exactly the memory
no value still in use occupies.

Outputs are handed out as tensors the allocator does not own: right after a capture its outputs'
blocks are given back to the allocator (their storages keep pointing there, without a deleter), and
a recording hands out tensors over those storages on every replay. Whether an output is held is its
storage's use count over the recording's own references. Before each capture the allocator's view of
the pool is reset to the checkpoint taken after the last capture or replay in the pool: of the blocks
allocated there, the ones whose outputs are held now stay allocated, the others are freed. That
checkpoint has every held output's block allocated: since the last run in the pool, outputs only
died, and that run itself was allowed only under the rule below. A capture so takes every block no
held output occupies: a backward's outputs reuse the memory of activations already consumed. The
buffers a recording copies inputs into are the capture's too, given back with it: free between
replays for later captures to take, as its scratch is (the rule below covers the copy in too). An
output outside the pool (a constant the graph returns, found by
the allocator's snapshot) is never given back.

The rule that keeps replays right: a recording replays only when every output of the pool held now
was held at its capture (its capture kept off that block), and none of its own is (a replay writes
them). Memory no capture knew about (an allocation a kernel kept) would break the reset: each reset
and capture checks the pool's live blocks are exactly the expected ones, and where they are not, the
pool takes no more captures (the device gets a new pool; recordings made keep replaying).

A pool lives while a graphed call that recorded into it lives or an output of it is held (a held
output's storage points into the pool's memory without owning it); then it is closed, and the
allocator gives its memory back on torch.cuda.empty_cache(), as it does a private pool's.
"""
from __future__ import annotations

import logging
import weakref

import torch

log = logging.getLogger("smelt.runtime")

Block = tuple[int, int]  # (data pointer, bytes) of an output's storage
retirements: list[str] = []  # why each pool stopped taking captures, for tests and probes


def use_count(storage_cdata: int) -> int:
    return torch._C._storage_Use_Count(storage_cdata)


class CudaAllocatorView:
    """The caching allocator's calls for one pool on one device."""

    def __init__(self, index: int, pool_id):
        self.index = index
        self.pool_id = pool_id

    def checkpoint(self):
        return torch._C._cuda_getCheckpointState(self.index, self.pool_id)

    def restore(self, state) -> None:
        # No storage is stale and none takes a deleter: every block the checkpoint has allocated stays
        # allocated (its owner is the pool's bookkeeping), freed by free() below.
        torch._C._cuda_setCheckpointPoolState(self.index, state, [], [])

    def free(self, pointer: int) -> None:
        torch._C._cuda_cudaCachingAllocator_raw_delete(pointer)

    def release(self, storage: torch.UntypedStorage) -> None:
        """Frees the storage's block in the allocator; the storage keeps pointing at it, owning nothing."""
        torch._C._free_And_Remove_DeleterFn(storage._cdata)

    def live_blocks_are(self, pointers: set[int]) -> bool:
        return torch._C._cuda_checkPoolLiveAllocations(self.index, self.pool_id, pointers)

    def _segments(self) -> list[dict]:
        # A pool's id is unique in the process (a counter over every device's pools).
        return [seg for seg in torch.cuda.memory_snapshot()
                if tuple(seg.get("segment_pool_id") or ()) == tuple(self.pool_id)]

    def size(self) -> int:
        """Bytes of the pool's memory (its segments: what it holds reserved)."""
        return sum(seg["total_size"] for seg in self._segments())

    def outside(self, pointers: list[int]) -> set[int]:
        """Those of `pointers` not in the pool's memory (a snapshot of the allocator: slow, rare)."""
        spans = [(seg["address"], seg["address"] + seg["total_size"]) for seg in self._segments()]
        return {p for p in pointers if not any(start <= p < end for start, end in spans)}


class PoolUnusable(Exception):
    """The pool's live blocks are not the expected ones: it takes no more captures."""


def _refused(e: RuntimeError) -> PoolUnusable:
    return PoolUnusable(f"the allocator refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


class SharedPool:
    """One pool's bookkeeping: the checkpoint of its last run, what the allocator keeps allocated for
    held outputs, and the recordings whose outputs may still be held."""

    def __init__(self, view, handle=None, keep=None):
        self.view = view
        self.handle = handle  # the pool's id for torch.cuda.graph(pool=...)
        self.keep = keep  # what holds the pool open (a graph of its own)
        self.last: tuple[object, dict[Block, int]] | None = None  # checkpoint and its allocated blocks
        self.kept: dict[Block, int] = {}  # blocks left allocated for held outputs at the last reset
        self.handed_out: dict[int, object] = {}  # recordings whose replays' outputs may be held
        self.usable = True
        self.users = weakref.WeakSet()  # the graphed calls that recorded into it
        self.closed = False

    def idle(self) -> bool:
        """Whether nothing can use its memory again: no graphed call that recorded into it is
        alive, and no output of it is held."""
        # Not len(users): inside a user's finalizer its dead reference may still count there.
        return next(iter(self.users), None) is None and not self.held()

    def close(self) -> None:
        """Lets the allocator have its memory (on the next empty_cache): frees the blocks kept for
        outputs once held and drops what held it open; its recordings go with their calls."""
        try:
            for pointer in self.kept.values():
                self.view.free(pointer)
        except RuntimeError as e:  # a retired pool's view may be off: its memory stays reserved
            log.debug("smelt: a closed CUDA graph pool kept a block: %s", e)
        self.kept, self.last, self.keep = {}, None, None
        self.handed_out.clear()
        self.usable, self.closed = False, True

    def held(self) -> dict[Block, object]:
        """The blocks of outputs held outside their recordings now, each with its recording."""
        held = {}
        for key, recording in list(self.handed_out.items()):
            blocks = recording.held_blocks()
            if not blocks:
                del self.handed_out[key]
                recording.forget_if_released()
                continue
            for block in blocks:
                held[block] = recording
        return held

    def ran(self, recording) -> None:
        self.last = recording.checkpoint
        self.handed_out[id(recording)] = recording

    def before_capture(self) -> dict[Block, int]:
        """Resets the allocator's view of the pool to the held outputs' blocks; returns them (the
        memory the capture keeps off). Raises PoolUnusable where that cannot be done."""
        held = self.held()
        try:
            if self.last is None:
                if held or not self.view.live_blocks_are(set()):
                    raise PoolUnusable("the pool has live blocks before its first capture")
                return {}
            state, allocated = self.last
            missing = [b for b in held if b not in allocated]
            if missing:
                raise PoolUnusable(f"{len(missing)} held outputs are not in the last run's checkpoint")
            for pointer in self.kept.values():
                self.view.free(pointer)
            self.kept = {}
            self.view.restore(state)
            for block, pointer in allocated.items():
                if block in held:
                    self.kept[block] = pointer
                else:
                    self.view.free(pointer)
            if not self.view.live_blocks_are(set(self.kept.values())):
                raise PoolUnusable("blocks no recording made are live in the pool")
        except RuntimeError as e:  # a block live now that the checkpoint has free; no checkpoints (cudaMallocAsync)
            raise _refused(e) from e
        return dict(self.kept)

    def after_capture(self, avoided: dict[Block, int], storages: list, scratch: list = ()) -> tuple:
        """The checkpoint of a capture whose outputs are `storages`; those in the pool, and `scratch`
        (memory the capture allocated that its replays use but no one holds between them: copied
        inputs' buffers), are then given back to the allocator. Returns the checkpoint and the
        storages given back (an output outside the pool is a constant the graph returns). Raises
        PoolUnusable (nothing given back) where the pool holds other blocks."""
        try:
            expected = set(avoided.values()) | {s.data_ptr() for s in storages} | {s.data_ptr() for s in scratch}
            if not self.view.live_blocks_are(expected):
                outside = self.view.outside([s.data_ptr() for s in storages])
                storages = [s for s in storages if s.data_ptr() not in outside]
                if not outside or not self.view.live_blocks_are(expected - outside):
                    raise PoolUnusable("the capture left blocks in the pool other than its outputs")
            allocated = dict(avoided)
            for storage in storages:
                allocated[(storage.data_ptr(), storage.nbytes())] = storage.data_ptr()
            for storage in scratch:
                self.view.release(storage)
            checkpoint = (self.view.checkpoint(), allocated)
        except RuntimeError as e:
            raise _refused(e) from e
        for storage in storages:
            self.view.release(storage)
        return checkpoint, storages

    def retire(self, why: str) -> None:
        self.usable = False
        retirements.append(why)
        log.debug("smelt: a CUDA graph pool takes no more captures: %s", why)
