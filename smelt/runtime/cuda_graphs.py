"""CUDA graphs (SMELT_CUDA_GRAPHS=1, or torch.compile(..., mode="reduce-overhead")): a compiled graph
is recorded once per distinct sizes and replayed, one launch for the whole call, with no host time
per kernel or ATen call.

A call at new sizes runs as usual, on the recording stream (cuBLAS's workspace for that stream and
every lazily loaded kernel are set up there: nothing may allocate lazily or compile while
recording). The next call at those sizes records, then replays; later calls replay.

Inputs. A recording reads some inputs where they are (parameters, another recording's outputs, and
any input found at the same address on the call that warmed up and the one that recorded) and copies
the others into buffers of its own before each replay. A recording replays only for a caller whose
tensor is at each such address (so the memory it reads is that caller's, live); one found elsewhere is
copied from then on, by a new recording (a caller's own tensor: a parameter or a recording's output
at that position later is still read in place). An input the graph writes into, when it is copied, is
copied back after the replay.

Memory. Every recording on a device records into one shared memory pool, as CUDA graphs captured
in sequence may: a recording keeps its outputs' memory for good, and the memory its other buffers
used (free again once it is captured) is taken by the recordings made after it. Outputs are handed
out as new tensors over the recording's memory. So a replay writes memory that a later recording's
outputs may occupy: a recording replays only when no recording made after it has outputs held
outside it (the use count of their storages), nor have its own last ones, so no replay overwrites a
value still in use. A recording refused so is made again, after them (the first calls record out
of order: a layer warms up while the next records its recording). Refused so a second time, the
outputs are held across calls (a loop's last result; not when they are this call's arguments, which
is data flow): the later recording is retired, and its graph at those sizes records into pools of its
own from then on, which no other recording writes; as does a caller whose own last outputs are held.
Otherwise another recording is made, up to MAX_HELD for one caller (the same in-place inputs), and
past that the call runs without a graph. A graph that each layer of a model calls has a recording per
layer (their parameters differ), up to MAX_RECORDINGS per sizes. An output that is an input, or a
view of one, is rebuilt over the caller's input.

A graph with CPU tensors or a host read of a device value (.item(), nonzero's length) runs without a
graph, as does one whose recording fails; each says why once in the log.
"""
from __future__ import annotations

import itertools
import logging
import weakref

import torch

log = logging.getLogger("smelt.runtime")

MAX_HELD = 4  # recordings of one caller whose earlier outputs are all still held
MAX_RECORDINGS = 64  # per graph and sizes, over all callers (a graph each layer of a model calls)
MAX_SIZES = 16  # distinct sizes recorded per graph; past it, new sizes run without a graph


def _use_count(storage_cdata: int) -> int:
    return torch._C._storage_Use_Count(storage_cdata)


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


# Storages of outputs of recordings (their data pointers), each with its recording: a graph reading
# one of a live recording reads it in place.
_recorded_storages: dict[int, weakref.ref] = {}


def _is_recorded_output(tensor: torch.Tensor) -> bool:
    owner = _recorded_storages.get(_storage_key(tensor))
    return owner is not None and owner() is not None


_capture_order = itertools.count()  # recordings in the order they were made (into the shared pool)
# Recordings in the shared pool whose last replay's outputs may still be held outside them (each
# replay adds its own; the check drops those found free): the ones a replay of an earlier recording
# must wait for. Held strongly: a released recording stays until its outputs are free.
_handed_out: dict[int, _Recording] = {}
# Per device index: the shared pool's handle, the graph that keeps it open, the recording stream.
_pools: dict[int, object] = {}
_anchors: dict[int, torch.cuda.CUDAGraph] = {}
_streams: dict[int, torch.cuda.Stream] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _shared_pool(device: torch.device):
    index = _index(device)
    if index not in _pools:
        handle = torch.cuda.graph_pool_handle()
        # A pool whose every graph is gone cannot take a capture again (the allocator asserts on
        # its id): a one-kernel graph, kept for the process, holds it open.
        anchor = torch.cuda.CUDAGraph()
        stream = _shared_stream(device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(anchor, pool=handle, stream=stream):
            torch.zeros(1, device=torch.device("cuda", index))
        _pools[index], _anchors[index] = handle, anchor
    return _pools[index]


def _shared_stream(device: torch.device) -> torch.cuda.Stream:
    """One recording stream per device: the caching allocator hands a freed block only to
    allocations on the stream that freed it, so captures on streams of their own share nothing
    of their pool (Whisper's peak with graphs fell only 2.45x -> 2.34x eager's so)."""
    index = _index(device)
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(index)
    return _streams[index]


def _later_outputs_held(recording: _Recording) -> list[_Recording]:
    """The recordings made after `recording` whose outputs are held outside them: memory a replay of
    `recording` may write (they took it once `recording`'s capture was done with it)."""
    held = []
    for key, other in list(_handed_out.items()):
        if other.free():
            del _handed_out[key]
            if other.graph is None:  # released: its outputs were kept only while held
                other.outputs = None
        elif other.order > recording.order:
            held.append(other)
    return held


class _Input:
    """How a recording gets input `position`: in place (it must be at `pointer`), or copied into
    `buffer` (through `view` when its elements overlap, as an expanded tensor's do)."""

    def __init__(self, position: int, tensor: torch.Tensor, in_place: bool):
        self.position = position
        self.in_place = in_place
        self.pointer = tensor.data_ptr()
        self.storage_offset = tensor.storage_offset()
        # The recording whose output it is, if one is: a recording reading a released one's outputs
        # in place replays no more (see _Recording.stale).
        self.source = _recorded_storages.get(_storage_key(tensor)) if in_place else None
        if in_place:
            # Not kept alive: a replay needs the caller's tensor at this address, which is then
            # what the recording reads; holding it would keep its owner's memory busy (a gradient
            # held by the optimizer's recording would stop the backward's from replaying).
            self.static = tensor
            return
        if _dense(tensor):
            self.span = None
            self.static = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype,
                                              device=tensor.device)
        else:  # the span of memory the view reaches, copied whole
            extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if n > 0)
            self.span = extent if tensor.numel() else 0
            buffer = torch.empty(max(self.span, 1), dtype=tensor.dtype, device=tensor.device)
            self.static = buffer.as_strided(tensor.size(), tensor.stride(), 0)
            self.span_buffer = buffer
        self.copy_in(tensor)

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
    def __init__(self, graph, inputs: list, outputs: list, shared: bool = True):
        self.graph = graph
        self.shared = shared  # recorded into the shared pool (else into one of its own)
        self.refusal = None  # why its last fit failed: "moved", "held" (its outputs), "later" (another's)
        self.recorded_again = False  # made in place of one refused so
        self.home: _Sizes | None = None  # its graph's state at its sizes (set by the caller)
        self.retired = False  # its outputs outlived a call of an earlier recording: replays no more
        self.inputs = inputs  # _Input per tensor argument, None for the others
        self.in_place = [(i.position, i.pointer) for i in inputs if i is not None and i.in_place]
        self.copied = [i for i in inputs if i is not None and not i.in_place]
        self.written_back: list = []  # copied inputs the graph writes into (set by the caller)
        self.outputs = outputs  # per output: ("pool", tensor) | ("input", position, size, stride, offset) | ("value", v)
        self.order = next(_capture_order)
        # Our own references to each output storage, to tell whether anyone else holds one.
        self.watched: list[tuple[int, int]] = []
        for kind, *rest in outputs:
            if kind == "pool":
                cdata = rest[0].untyped_storage()._cdata
                if all(c != cdata for c, _ in self.watched):
                    self.watched.append((cdata, 0))
        self.watched = [(c, _use_count(c)) for c, _ in self.watched]
        for kind, *rest in outputs:
            if kind == "pool":
                _recorded_storages[_storage_key(rest[0])] = weakref.ref(self)

    def fits(self, args) -> bool:
        """Whether these arguments can replay it: its in-place inputs where they were recorded, and
        nothing outside it holding its last outputs (nor a later recording's: see the module's
        docstring)."""
        self.refusal = None
        if self.retired:
            self.refusal = "retired"
            return False
        for position, pointer in self.in_place:
            if args[position].data_ptr() != pointer:
                self.refusal = "moved"
                return False
        if not self.free():
            self.refusal = "held"
            return False
        later = _later_outputs_held(self) if self.shared else []
        if later:
            # This one is recorded again after them. Refused so a second time, the outputs are held
            # across calls of earlier graphs (a loop's last result), not just recorded out of order:
            # their graph records into pools of its own from now on. Not so for an output passed to
            # this call: that is data flow (this one was recorded before its producer), which
            # recording this one again after the producer puts in order.
            if self.recorded_again:
                passed = {_storage_key(a) for a in args if isinstance(a, torch.Tensor)}
                for other in later:
                    if other.holds_any(passed):
                        continue
                    other.retired = True
                    if other.home is not None:
                        other.home.private = True
            self.refusal = "later"
            return False
        return True

    def holds_any(self, storage_keys: set[int]) -> bool:
        return any(kind == "pool" and _storage_key(rest[0]) in storage_keys for kind, *rest in self.outputs or ())

    def free(self) -> bool:
        return all(_use_count(c) <= n for c, n in self.watched)

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
                results.append(source.as_strided(size, stride, source.storage_offset() + offset))
            else:
                results.append(rest[0])
        args.clear()
        if self.shared and self.watched:
            _handed_out[id(self)] = self
        return tuple(results)

    def release(self) -> None:
        for kind, *rest in self.outputs:
            if kind == "pool":
                _recorded_storages.pop(_storage_key(rest[0]), None)
        self.graph = self.inputs = self.copied = self.written_back = None
        if id(self) in _handed_out and not self.free():
            return  # its outputs, still held: the recordings made before it wait for them
        _handed_out.pop(id(self), None)
        self.outputs = None


class _Sizes:
    """The state of one graph at one tuple of sizes."""

    def __init__(self, pointers: list):
        self.warm_pointers = pointers  # each argument's data pointer on the warm-up call
        self.recordings: list[_Recording] = []
        self.private = False  # its recordings' outputs were held across calls of earlier ones


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

    def __call__(self, args: list):
        if self.blocked is not None:
            self._say(f"runs without a CUDA graph: {self.blocked}")
            return self.call(args)
        key = self.size_key(args)
        sizes = self.sizes.get(key)
        if sizes is None:
            if len(self.sizes) >= MAX_SIZES:
                self._say(f"runs without a CUDA graph at new sizes: {MAX_SIZES} sizes recorded already")
                return self.call(args)
            if not self._all_on_device(args):
                self.blocked = "an input is not a CUDA tensor"
                return self(args)
            self.sizes[key] = _Sizes([a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args])
            return self._warm_up(args)
        for recording in sizes.recordings:
            if recording.fits(args):
                self.replays += 1
                return recording.replay(args)
        # A recording whose in-place inputs differ only in the caller's own tensors (neither parameters
        # nor recordings' outputs) was this caller's: those tensors move from call to call, so they are
        # copied from now on. One differing in a parameter or a recording's output serves another
        # caller (one graph called by each layer of a model) and is kept for it.
        for recording in list(sizes.recordings):
            moved = recording.moved_inputs(args)
            own = moved and all(self._callers_own(args[p]) for p in moved)
            if own or recording.retired or recording.stale():
                if own:
                    self.copied_always.update(moved)
                sizes.recordings.remove(recording)
                recording.release()
        held = sum(1 for r in sizes.recordings if not r.moved_inputs(args))
        if held >= MAX_HELD:
            self._say(f"ran without a CUDA graph: the outputs of its last {MAX_HELD} replays are still "
                      f"held (keep a copy, out.clone(), to let it replay)")
            return self.call(args)
        if len(sizes.recordings) >= MAX_RECORDINGS:
            self._say(f"ran without a CUDA graph for a new caller: {MAX_RECORDINGS} recordings at these sizes")
            return self.call(args)
        # A caller whose own last outputs are held (a loop that keeps its last result while it calls
        # again) records into a pool of its own: a shared one made now would be refused on the next
        # call, for these outputs' successors. One refused for a later recording's held outputs is
        # recorded again, after them.
        held_own = any(r.refusal == "held" for r in sizes.recordings)
        later = [r for r in sizes.recordings if r.refusal == "later"]
        shared = not sizes.private and not held_own
        for r in later:
            sizes.recordings.remove(r)
            r.release()
        recording = self._record(args, sizes, shared)
        if recording is None:
            return self.call(args)
        recording.recorded_again = bool(later)
        recording.home = sizes
        sizes.recordings.append(recording)
        self.recorded += 1
        self.replays += 1
        return recording.replay(args)

    @staticmethod
    def _callers_own(tensor) -> bool:
        return not isinstance(tensor, torch.nn.Parameter) and not _is_recorded_output(tensor)

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

    def _reads_in_place(self, position: int, tensor: torch.Tensor, sizes: _Sizes) -> bool:
        # A parameter or a recording's output stays where it is from call to call: read in place even
        # at a position where a caller's own tensor once moved (a warm-up's or a released recording's
        # output there marked it: Whisper's backward graphs copied 1 GiB of saved activations so).
        if isinstance(tensor, torch.nn.Parameter) or _is_recorded_output(tensor):
            return True
        return position not in self.copied_always and sizes.warm_pointers[position] == tensor.data_ptr()

    @staticmethod
    def _all_on_device(args) -> bool:
        return all(a.is_cuda for a in args if isinstance(a, torch.Tensor))

    def _capture(self, static_args: list, device, shared: bool):
        """The CUDA graph of one call over static_args, and that call's outputs (in the shared pool,
        or a pool of its own)."""
        graph = torch.cuda.CUDAGraph()
        stream = self._recording_stream(device)
        stream.wait_stream(torch.cuda.current_stream())  # the copies into the static inputs
        # Relaxed: a combo kernel's pointer table is written from the host, on a stream of its own,
        # while its launch records (runtime/combo_launcher.py). Syncs of the recording stream
        # itself still fail, and graphs that read device values on the host never record.
        with torch.cuda.graph(graph, pool=_shared_pool(device) if shared else None, stream=stream, capture_error_mode="relaxed"):
            outputs = self.call(static_args)
        torch.cuda.synchronize()  # those tables are written before the first replay
        return graph, outputs

    def _record(self, args: list, sizes: _Sizes, shared: bool) -> _Recording | None:
        inputs = [_Input(p, a, self._reads_in_place(p, a, sizes)) if isinstance(a, torch.Tensor) else None
                  for p, a in enumerate(args)]
        static_args = [i.static if i is not None else a for i, a in zip(inputs, args)]
        try:
            graph, outputs = self._capture(static_args, self._device(args), shared)
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
        del outputs, static_args, out, by_storage  # the baseline of each output storage's use count is ours alone
        for i in inputs:
            if i is not None and i.in_place:
                i.static = None  # see _Input: the caller's tensor is not kept
        recording = self.recording_type(graph, inputs, described, shared)
        recording.written_back = [i for i in recording.copied if i.position in self.mutated]
        log.debug("smelt: %s recorded a CUDA graph (%s): %d inputs read in place, %d copied, %d written back",
                  self.name, "shared pool" if shared else "a pool of its own", len(recording.in_place),
                  len(recording.copied), len(recording.written_back))
        return recording
