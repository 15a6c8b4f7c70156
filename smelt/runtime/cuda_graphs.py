"""CUDA graphs (SMELT_CUDA_GRAPHS=1, or torch.compile(..., mode="reduce-overhead")): a compiled graph
is recorded once per distinct sizes and replayed, one launch for the whole call, with no host time
per kernel or ATen call.

A call at new sizes runs as usual, on the recording stream (cuBLAS's workspace for that stream and
every lazily loaded kernel are set up there: nothing may allocate lazily or compile while
recording), as does each new caller's first call (a caller: the parameters it passes, a layer of a
model). The next call records, then replays; later calls replay. A graph told apart by no parameter
(a layer's backward, given casts of its weights) also waits while the layers' graphs warm up, for
the process's first step to end (_FirstStep), so that the second step records everything in order.

Inputs. A recording reads some inputs where they are (parameters, another recording's outputs, and
any input found at the same address on the call that warmed up and the one that recorded) and copies
the others into buffers of its own before each replay. A recording replays only for a caller whose
tensor is at each such address (so the memory it reads is that caller's, live); one found elsewhere is
copied from then on, by a new recording (a caller's own tensor: a parameter or a recording's output
at that position later is still read in place). An input the graph writes into, when it is copied, is
copied back after the replay.

Memory. Every recording on a device records into one shared memory pool (runtime/graph_pool.py):
an output's memory goes back to the pool once the output is dead, for the next capture to take, and a
recording replays only when every output of the pool held now was held at its capture, and none of
its own is (so no replay overwrites a value still in use). A recording refused so is kept, and
another is made where the outputs held now are kept off: a graph called at several points of a step
(each layer's backward, with the gradients of the layers before it held) gets one recording per
point, and the first steps, which record out of order (a layer warms up while the next records),
leave recordings that are dropped once MAX_RECORDINGS are made, the longest unused first. A graph
each layer of a model calls has a recording per layer (their parameters differ). Where the last
MAX_HELD recordings' outputs are all still held (a caller keeping every result), the call runs
without a graph. An output that is an input, or a view of one, is rebuilt over the caller's input.

A graph with CPU tensors or a host read of a device value (.item(), nonzero's length) runs without a
graph, as does one whose recording fails; each says why once in the log.
"""
from __future__ import annotations

import logging
import weakref

import torch

from smelt.runtime.graph_pool import Block, CudaAllocatorView, PoolUnusable, SharedPool, use_count

log = logging.getLogger("smelt.runtime")

MAX_HELD = 4  # recordings at one sizes whose last outputs are all still held
# Per graph and sizes: a graph each layer of a model calls has a recording per layer, and one called
# at several points of a step (each layer's backward) one per set of outputs held there.
MAX_RECORDINGS = 256
MAX_SIZES = 16  # distinct sizes recorded per graph; past it, new sizes run without a graph


def _dense(tensor: torch.Tensor) -> bool:
    """Whether its elements fill a block of memory exactly, in some order of its dims."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(tensor.shape, tensor.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


# Output storages of recordings (their StorageImpl), each with its recording: a graph reading one of a
# live recording reads it in place.
_recorded_storages: dict[int, weakref.ref] = {}


def _recorded_source(tensor: torch.Tensor):
    owner = _recorded_storages.get(tensor.untyped_storage()._cdata)
    return owner if owner is not None and owner() is not None else None


# Per device index: the shared pool (a new one where the last became unusable), the recording stream.
_pools: dict[int, SharedPool] = {}
_streams: dict[int, torch.cuda.Stream] = {}
_shared_pools_work = True  # false once a new pool could not be reset for a capture
# Every pool not yet closed: the current ones, and retired ones whose calls or outputs still live.
_live: list[SharedPool] = []
_capturing = 0  # captures under way: no pool is closed during one (a finalizer may run in it)


def release_idle_pools() -> int:
    """Closes every pool that no live graphed call recorded into and that holds no output still in
    use; returns how many. Their memory goes back to the device on torch.cuda.empty_cache(). Runs
    whenever a graphed call is freed (after torch._dynamo.reset(), once nothing else holds its
    graph: smelt.observe keeps the latest few)."""
    if _capturing:
        return 0
    closed = 0
    for pool in list(_live):
        if pool.idle():
            pool.close()
            _live.remove(pool)
            for index in [i for i, p in _pools.items() if p is pool]:
                del _pools[index]
            closed += 1
    return closed


def reset() -> None:
    """torch._dynamo.reset(), through smelt's backend: every graphed call forgets its recordings (one
    called again warms up and records anew, in a new pool), and pools no held output keeps close.
    A compiled function may outlive the reset (Dynamo leaves it in the module's globals), so its
    recordings cannot be left to the garbage collector, as Inductor's are not."""
    global _first_step
    for pool in list(_live):
        for call in list(pool.users):
            call.forget_recordings()
    _first_step = _FirstStep()
    release_idle_pools()


def _adopt(pool: SharedPool, call) -> None:
    """Records that `call` recorded into `pool`: the pool lives at least as long as the call."""
    if pool not in _live:
        _live.append(pool)
    if call not in pool.users:
        pool.users.add(call)
        weakref.finalize(call, release_idle_pools)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _shared_pool(device: torch.device) -> SharedPool:
    index = _index(device)
    release_idle_pools()
    pool = _pools.get(index)
    if pool is None or not pool.usable:
        handle = torch.cuda.graph_pool_handle()
        # A pool whose every graph is gone cannot take a capture again (the allocator asserts on
        # its id): a one-kernel graph, kept with the pool, holds it open.
        anchor = torch.cuda.CUDAGraph()
        stream = _shared_stream(device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(anchor, pool=handle, stream=stream):
            torch.zeros(1, device=torch.device("cuda", index))
        pool = _pools[index] = SharedPool(CudaAllocatorView(index, handle), handle, anchor)
    return pool


def _shared_stream(device: torch.device) -> torch.cuda.Stream:
    """One recording stream per device: the caching allocator hands a freed block only to
    allocations on the stream that freed it, so captures on streams of their own share nothing
    of their pool (Whisper's peak with graphs fell only 2.45x -> 2.34x eager's so)."""
    index = _index(device)
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(index)
    return _streams[index]


class _Input:
    """How a recording gets input `position`: in place (it must be at `pointer`), or copied into
    `static` before each replay (the whole span of memory it reaches when its elements overlap, as
    an expanded tensor's do). A copy's buffer is memory of the capture: in the shared pool it is
    free between replays, for later captures, as the capture's other scratch is."""

    def __init__(self, position: int, tensor: torch.Tensor, in_place: bool):
        self.position = position
        self.in_place = in_place
        self.pointer = tensor.data_ptr()
        self.storage_offset = tensor.storage_offset()
        # The recording whose output it is, if one is: a recording reading a released one's outputs
        # in place replays no more (see _Recording.stale).
        self.source = _recorded_source(tensor) if in_place else None
        if in_place:
            # Not kept alive: a replay needs the caller's tensor at this address, which is then
            # what the recording reads; holding it would keep its owner's memory busy (a gradient
            # held by the optimizer's recording would stop the backward's from replaying).
            self.static = tensor
            return
        self.layout = (tuple(tensor.size()), tuple(tensor.stride()), tensor.dtype, tensor.device)
        if _dense(tensor):
            self.span = None
        else:  # the span of memory the view reaches, copied whole
            extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if n > 0)
            self.span = extent if tensor.numel() else 0
        self.static = None  # allocated with the capture (allocate()): memory it had free, as its own

    def allocate(self, empty) -> None:
        """The buffer it is copied into; empty(size, stride, dtype, device) allocates."""
        size, stride, dtype, device = self.layout
        if self.span is None:
            self.static = empty(size, stride, dtype, device)
        else:
            self.span_buffer = empty((max(self.span, 1),), (1,), dtype, device)
            self.static = self.span_buffer.as_strided(size, stride, 0)

    def buffer(self) -> torch.Tensor:
        return self.static if self.span is None else self.span_buffer

    def copy_in(self, tensor: torch.Tensor) -> None:
        if self.span is None:
            self.static.copy_(tensor)
        elif self.span:
            self.span_buffer.copy_(tensor.as_strided((self.span,), (1,), tensor.storage_offset()))

    def copy_back(self, tensor: torch.Tensor) -> None:
        if self.span is None:
            tensor.copy_(self.static)
        elif self.span:
            tensor.as_strided((self.span,), (1,), tensor.storage_offset()).copy_(self.span_buffer)


class _Recording:
    def __init__(self, graph, inputs: list, outputs: list, pool: SharedPool | None = None,
                 checkpoint=None, avoided: frozenset[Block] = frozenset(), given_back=None):
        self.graph = graph
        self.pool = pool  # the shared pool it was recorded into (else one of its own)
        self.shared = pool is not None
        self.checkpoint = checkpoint  # the pool's allocator state after its capture, and its blocks
        self.avoided = avoided  # blocks of outputs held at its capture: its replays never write them
        self.refusal = None  # why its last fit failed: "moved", "held" (its outputs), "others held" (theirs)
        self.used = 0  # when it last replayed (a call count), to drop the longest unused at the cap
        self.inputs = inputs  # _Input per tensor argument, None for the others
        self.in_place = [(i.position, i.pointer) for i in inputs if i is not None and i.in_place]
        self.copied = [i for i in inputs if i is not None and not i.in_place]
        self.written_back: list = []  # copied inputs the graph writes into (set by the caller)
        # Per output: ("pool", tensor) | ("input", position, size, stride, offset) | ("value", v): memory
        # of the capture (or a constant), a view of an input, a non-tensor.
        self.outputs = outputs
        # Per output storage: our own references to it (to tell whether anyone else holds it), and its
        # block where it is memory of the shared pool's capture (None: a constant's, or not shared).
        self.watched: list[tuple[int, int, Block | None]] = []
        seen = set()
        for kind, *rest in outputs:
            if kind == "pool":
                storage = rest[0].untyped_storage()
                if storage._cdata not in seen:
                    seen.add(storage._cdata)
                    back = (pool is not None and storage.nbytes()
                            and (given_back is None or storage._cdata in given_back))
                    self.watched.append((storage._cdata, 0, (storage.data_ptr(), storage.nbytes()) if back else None))
        self.watched = [(c, use_count(c), block) for c, _, block in self.watched]
        for kind, *rest in outputs:
            if kind == "pool":
                _recorded_storages[rest[0].untyped_storage()._cdata] = weakref.ref(self)

    def fits(self, args, held_in) -> bool:
        """Whether these arguments can replay it: its in-place inputs where they were recorded, and
        nothing outside it holding its last outputs, nor another recording's outputs its capture did
        not keep off (see the module's docstring). held_in(pool): the blocks of that pool's held
        outputs, each with its recording."""
        self.refusal = None
        for position, pointer in self.in_place:
            if args[position].data_ptr() != pointer:
                self.refusal = "moved"
                return False
        if not self.free():
            self.refusal = "held"
            return False
        if self.pool is not None:
            avoided = self.avoided
            for block, owner in held_in(self.pool).items():
                if block not in avoided and owner is not self:
                    self.refusal = "others held"
                    return False
        return True

    def free(self) -> bool:
        return all(use_count(c) <= n for c, n, _ in self.watched)

    def held_blocks(self) -> list[Block]:
        return [block for c, n, block in self.watched if block is not None and use_count(c) > n]

    def forget_if_released(self) -> None:
        if self.graph is None:  # released: its outputs were kept only while held
            self.outputs = None

    def stale(self) -> bool:
        """Whether it reads in place the outputs of a recording since released: memory no caller of
        it will hold again."""
        for i in self.inputs or ():
            if i is not None and i.source is not None:
                source = i.source()
                if source is None or source.graph is None:
                    return True
        return False

    def moved_inputs(self, args) -> list[int]:
        return [p for p, pointer in self.in_place if args[p].data_ptr() != pointer]

    def replay(self, args: list):
        for i in self.copied:
            i.copy_in(args[i.position])
        self.graph.replay()
        for i in self.written_back:
            i.copy_back(args[i.position])
        results = []
        for kind, *rest in self.outputs:
            if kind == "pool":
                results.append(rest[0].detach())  # a new tensor over the recording's memory
            elif kind == "input":
                position, size, stride, offset = rest
                source = args[position]
                if offset == 0 and size == tuple(source.size()) and stride == tuple(source.stride()):
                    # The input itself, as an ungraphed call returns it: a parameter a forward saves stays
                    # a Parameter for its backward, whose callers are told by their parameters.
                    results.append(source)
                else:
                    results.append(source.as_strided(size, stride, source.storage_offset() + offset))
            else:
                results.append(rest[0])
        args.clear()
        if self.pool is not None:
            self.pool.ran(self)
        return tuple(results)

    def release(self) -> None:
        for kind, *rest in self.outputs:
            if kind == "pool":
                _recorded_storages.pop(rest[0].untyped_storage()._cdata, None)
        self.graph = self.inputs = self.copied = self.written_back = None
        if self.pool is not None and id(self) in self.pool.handed_out and not self.free():
            return  # its outputs, still held: the pool keeps their memory off later captures
        if self.pool is not None:
            self.pool.handed_out.pop(id(self), None)
        self.outputs = None


def output_bytes(recordings) -> int:
    """Bytes of these recordings' outputs, each storage once: what the pool would hold if every
    recording kept its outputs for good (for probes and tests, against the pool's size)."""
    storages = {}
    for r in recordings:
        for kind, *rest in r.outputs or ():
            if kind == "pool":
                storage = rest[0].untyped_storage()
                storages.setdefault(storage._cdata, storage.nbytes())
    return sum(storages.values())


def _pointers(args) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


def _caller(args) -> tuple:
    """Which caller this is, as far as its parameters tell (a graph each layer calls: the layer)."""
    return tuple((p, a.data_ptr()) for p, a in enumerate(args) if isinstance(a, torch.nn.Parameter))


class _FirstStep:
    """The process's first step under CUDA graphs, as the graphs told apart by their parameters (a
    model's layers) show it: from the first such call until one of them is called again, or the
    process's first graphed call is (the next step begins with it). A graph told apart by none (a
    layer's backward, given casts of its weights) waits for it to end before it records: recorded in
    the first step, its recordings would be made while the layers warm up, out of order, and made
    again."""

    def __init__(self):
        self.seen = False  # a graph told apart by its parameters has run
        self.over = False  # one of them came back, or the first graph did
        self.first = None  # the first graphed call made (weakly) and its caller

    def called(self, call, caller: tuple) -> None:
        # A step's first graph, told apart by no parameter (OPT's mask), waited for the step's end
        # itself and recorded a step late, and every graph after it again (its outputs moved).
        if self.first is None:
            self.first = (weakref.ref(call), caller)
        elif self.first[0]() is call and self.first[1] == caller:
            self.over = True

    def open(self) -> bool:
        return self.seen and not self.over


_first_step = _FirstStep()
MAX_WAIT = 64  # calls a graph told apart by no parameter waits for the first step's end, at most


class _Sizes:
    """The state of one graph at one tuple of sizes."""

    def __init__(self):
        # Per caller, each argument's data pointer on its warm-up call. A caller's first call warms
        # up, the next records: a graph each layer calls records in the second step, in the program's
        # order, not layer 2 onward in the first step (out of order: recorded again once the first
        # layer records, with their outputs' memory taken again in the pool).
        self.warm: dict[tuple, list] = {}
        self.recordings: list[_Recording] = []
        self.held_own = 0  # recordings made because a recording's own last outputs were held
        self.waited = 0  # calls warmed up waiting for the first step's end (see _FirstStep)


class GraphedCall:
    """The boxed call AOTAutograd makes, through CUDA graph recordings (see the module docstring)."""

    recording_type = _Recording

    def __init__(self, call, name: str, size_key, mutated_inputs, blockers):
        self.call = call
        self.name = name
        self.size_key = size_key
        self.mutated = frozenset(mutated_inputs)
        self.blocked = "; ".join(blockers) or None
        self.sizes: dict = {}
        self.copied_always: set[int] = set()  # positions where a caller's own tensor moved: copied
        self.said: set[str] = set()
        self.replays = 0  # for tests and the report: calls served by a replay
        self.recorded = 0  # recordings made, released ones included
        self.clock = 0  # replays so far: when each recording was last used

    def __call__(self, args: list):
        if self.blocked is not None:
            self._say(f"runs without a CUDA graph: {self.blocked}")
            return self.call(args)
        if not _first_step.over:  # the caller is asked only then: replays pay for nothing here
            _first_step.called(self, _caller(args))
        key = self.size_key(args)
        sizes = self.sizes.get(key)
        if sizes is None:
            if len(self.sizes) >= MAX_SIZES:
                self._say(f"runs without a CUDA graph at new sizes: {MAX_SIZES} sizes recorded already")
                return self.call(args)
            if not self._all_on_device(args):
                self.blocked = "an input is not a CUDA tensor"
                return self(args)
            sizes = self.sizes[key] = _Sizes()
            caller = _caller(args)
            sizes.warm[caller] = _pointers(args)
            _first_step.seen |= bool(caller)
            return self._warm_up(args)
        held: dict = {}

        def held_in(pool):  # computed once per call and pool: the costly part of a fit
            if pool not in held:
                held[pool] = pool.held()
            return held[pool]
        for recording in sizes.recordings:
            if recording.fits(args, held_in):
                return self._replay(recording, args)
        caller = _caller(args)
        if caller not in sizes.warm and len(sizes.warm) < MAX_RECORDINGS:
            sizes.warm[caller] = _pointers(args)
            _first_step.seen |= bool(caller)
            return self._warm_up(args)
        if caller:  # a layer called again: its first step is over, recorded or not
            _first_step.over = True
        elif _first_step.open() and sizes.waited < MAX_WAIT:
            sizes.waited += 1
            return self._warm_up(args)
        # A recording whose in-place inputs differ only in the caller's own tensors (neither parameters
        # nor recordings' outputs) was this caller's: those tensors move from call to call, so they are
        # copied from now on. One differing in a parameter or a recording's output serves another
        # caller (one graph called by each layer of a model) and is kept for it, as is one refused for
        # other recordings' held outputs: it serves the points of a step where those are not held.
        for recording in list(sizes.recordings):
            moved = recording.moved_inputs(args)
            own = moved and all(self._callers_own(args[p]) for p in moved)
            if own or recording.stale():
                if own:
                    self.copied_always.update(moved)
                sizes.recordings.remove(recording)
                recording.release()
        if sum(r.refusal == "held" for r in sizes.recordings) >= MAX_HELD:
            self._say(f"ran without a CUDA graph: the outputs of its last {MAX_HELD} replays are still "
                      f"held (keep a copy, out.clone(), to let it replay)")
            return self.call(args)
        if len(sizes.recordings) >= MAX_RECORDINGS:
            unused = min((r for r in sizes.recordings if r.free()), key=lambda r: r.used, default=None)
            if unused is None:
                self._say(f"ran without a CUDA graph: {MAX_RECORDINGS} recordings at these sizes, all held")
                return self.call(args)
            sizes.recordings.remove(unused)
            unused.release()
        # A recording refused because its own last outputs are still held: the caller keeps them
        # while it calls again (a loop's last result), or another caller's arguments came to the same
        # addresses. Recorded again in the shared pool with them kept off; the second time at these
        # sizes, the outputs are taken to outlive calls, and recordings go to pools of their own: a
        # result held across calls would otherwise block every recording made after it in the pool.
        held_own = any(r.refusal == "held" for r in sizes.recordings)
        sizes.held_own += held_own
        shared = not (held_own and sizes.held_own > 1)
        log.debug("smelt: %s records (%s)%s", self.name,
                  ", ".join(r.refusal or "?" for r in sizes.recordings) or "the first at these sizes",
                  "" if shared else " into a pool of its own: its outputs outlive calls")
        recording = self._record(args, sizes, shared)
        if recording is None:
            return self.call(args)
        sizes.recordings.append(recording)
        self.recorded += 1
        return self._replay(recording, args)

    def forget_recordings(self) -> None:
        """Releases every recording (their outputs still held keep their memory off later captures
        until they die); the next call at any sizes warms up and records again."""
        for sizes in self.sizes.values():
            for recording in sizes.recordings:
                recording.release()
        self.sizes.clear()
        for pool in _live:
            pool.users.discard(self)

    def _replay(self, recording: _Recording, args: list):
        self.replays += 1
        self.clock += 1
        recording.used = self.clock
        return recording.replay(args)

    @staticmethod
    def _callers_own(tensor) -> bool:
        return not isinstance(tensor, torch.nn.Parameter) and _recorded_source(tensor) is None

    def _say(self, what: str) -> None:
        if what not in self.said:
            self.said.add(what)
            log.warning("smelt: %s %s", self.name, what)

    @staticmethod
    def _recording_stream(device) -> torch.cuda.Stream:
        return _shared_stream(device)

    def _device(self, args):
        for a in args:
            if isinstance(a, torch.Tensor):
                return a.device
        return torch.device("cuda", torch.cuda.current_device())

    def _warm_up(self, args: list):
        stream = self._recording_stream(self._device(args))
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results = self.call(args)
        torch.cuda.current_stream().wait_stream(stream)
        return results

    def _reads_in_place(self, position: int, tensor: torch.Tensor, warm: list | None) -> bool:
        # A parameter or a recording's output stays where it is from call to call: read in place even
        # at a position where a caller's own tensor once moved (a warm-up's or a released recording's
        # output there marked it: Whisper's backward graphs copied 1 GiB of saved activations so).
        if isinstance(tensor, torch.nn.Parameter) or _recorded_source(tensor) is not None:
            return True
        return position not in self.copied_always and warm is not None and warm[position] == tensor.data_ptr()

    @staticmethod
    def _all_on_device(args) -> bool:
        return all(a.is_cuda for a in args if isinstance(a, torch.Tensor))

    @staticmethod
    def _shared_pool(device) -> SharedPool:
        return _shared_pool(device)

    @staticmethod
    def _empty(size, stride, dtype, device):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    def _static_args(self, inputs: list, args: list) -> list:
        """The capture's arguments: copied inputs get their buffers, allocated now (inside the
        capture: from its pool)."""
        for i in inputs:
            if i is not None and not i.in_place:
                i.allocate(self._empty)
        return [i.static if i is not None else a for i, a in zip(inputs, args)]

    def _capture(self, inputs: list, args: list, device, pool: SharedPool | None):
        """The CUDA graph of one call, and that call's outputs (in the shared pool, or a pool of
        its own)."""
        global _capturing
        graph = torch.cuda.CUDAGraph()
        stream = self._recording_stream(device)
        stream.wait_stream(torch.cuda.current_stream())
        # Relaxed: a combo kernel's pointer table is written from the host, on a stream of its own,
        # while its launch records (runtime/combo_launcher.py). Syncs of the recording stream
        # itself still fail, and graphs that read device values on the host never record.
        _capturing += 1
        # cuBLAS keeps a workspace per stream, made at its first product there (the warm-up's,
        # outside the pool: 32 MiB on the H200 that stayed reserved beside the pool, MobileNetV3's
        # reserved peak 1.37x Inductor's). Forgotten before the capture, the capture makes its own
        # in the pool, and forgotten after it, that is memory of the capture like its other
        # temporaries; nor does a recording read a workspace that another's clearing frees
        # (Inductor's graphs clear every workspace around their captures).
        torch._C._cuda_clearCublasWorkspaces()
        try:
            with torch.cuda.graph(graph, pool=pool.handle if pool is not None else None, stream=stream,
                                  capture_error_mode="relaxed"):
                outputs = self.call(self._static_args(inputs, args))
        finally:
            _capturing -= 1
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.synchronize()  # those tables are written before the first replay
        return graph, outputs

    def _pool_for_capture(self, device) -> tuple[SharedPool | None, dict]:
        """The shared pool, reset for a capture, and the held outputs' blocks the capture keeps off;
        no pool where a new one cannot be reset either (an allocator without checkpoints, as
        cudaMallocAsync): the capture gets a pool of its own."""
        global _shared_pools_work
        if not _shared_pools_work:
            return None, {}
        for attempt in range(2):
            pool = self._shared_pool(device)
            try:
                return pool, pool.before_capture()
            except PoolUnusable as e:
                pool.retire(str(e))
                why = str(e)
        _shared_pools_work = False
        log.warning("smelt: CUDA graph recordings get pools of their own (more memory): %s", why)
        return None, {}

    def _record(self, args: list, sizes: _Sizes, shared: bool = True) -> _Recording | None:
        warm = sizes.warm.get(_caller(args))
        inputs = [_Input(p, a, self._reads_in_place(p, a, warm)) if isinstance(a, torch.Tensor) else None
                  for p, a in enumerate(args)]
        device = self._device(args)
        pool, avoided = self._pool_for_capture(device) if shared else (None, {})
        shared = pool is not None
        if shared:
            _adopt(pool, self)
        try:
            graph, outputs = self._capture(inputs, args, device, pool)
        except Exception as e:  # an op that syncs with the host, or one a graph cannot hold
            self.blocked = f"recording failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            self._say(f"runs without a CUDA graph: {self.blocked}")
            return None
        by_storage = {}
        for i in inputs:
            if i is not None:
                by_storage.setdefault(_storage_key(i.static), i)
        described, out = [], None
        for out in outputs:
            if not isinstance(out, torch.Tensor):
                described.append(("value", out))
                continue
            source = by_storage.get(_storage_key(out)) if out.untyped_storage().nbytes() else None
            if source is not None:
                described.append(("input", source.position, tuple(out.size()), tuple(out.stride()),
                                  out.storage_offset() - source.static.storage_offset()))
            else:
                described.append(("pool", out))
        del outputs, out, by_storage  # the baseline of each output storage's use count is ours alone
        for i in inputs:
            if i is not None and i.in_place:
                i.static = None  # see _Input: the caller's tensor is not kept
        checkpoint, given_back = None, None
        if pool is not None:
            storages = {}
            for kind, *rest in described:
                if kind == "pool" and rest[0].untyped_storage().nbytes():
                    storage = rest[0].untyped_storage()
                    storages.setdefault(storage._cdata, storage)
            buffers = {}
            for i in inputs:
                if i is not None and not i.in_place and i.buffer().untyped_storage().nbytes():
                    storage = i.buffer().untyped_storage()
                    buffers.setdefault(storage._cdata, storage)
            try:
                checkpoint, back = pool.after_capture(avoided, list(storages.values()), list(buffers.values()))
                given_back = {s._cdata for s in back}
                del back
            except PoolUnusable as e:  # its outputs stay the allocator's: kept for good, as before
                pool.retire(str(e))
            del storages, buffers
        # Where the pool could not be checked (it takes no more captures), every output's block is
        # watched: a replay of an earlier recording may write where it lies.
        recording = self.recording_type(graph, inputs, described, pool, checkpoint, frozenset(avoided), given_back)
        recording.written_back = [i for i in recording.copied if i.position in self.mutated]
        log.debug("smelt: %s recorded a CUDA graph (%s): %d inputs read in place, %d copied, %d written back",
                  self.name, "shared pool" if shared else "a pool of its own", len(recording.in_place),
                  len(recording.copied), len(recording.written_back))
        return recording
