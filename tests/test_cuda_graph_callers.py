"""Which recording a CUDA-graphed call replays, and when it records (runtime/cuda_graphs.py), on the
CPU: the capture is a stand-in that reruns the call, so the bookkeeping around it (in-place inputs,
held outputs, one graph called by several layers) is tested without a GPU. tests/gpu/test_cuda_graphs.py
runs the same rules through real CUDA graphs."""
import gc

import pytest
import torch

from smelt.runtime import cuda_graphs
from smelt.runtime.cuda_graphs import MAX_HELD, GraphedCall, _Recording
from smelt.runtime.graph_pool import SharedPool

BLOCK = 64  # the stand-in allocator's rounding


class _ArenaView:
    """The caching allocator's view of one pool, over a CPU arena: a capture's allocations take the
    first free range, as the allocator reuses a pool's free blocks, so a replay writing memory that a
    held output occupies shows in that output's values."""

    def __init__(self, size=1 << 16):
        self.whole = torch.frombuffer(bytearray(size), dtype=torch.uint8)
        self.base = self.whole.data_ptr()
        self.allocated: dict[int, int] = {}  # pointer -> bytes
        self.high = 0  # the highest byte ever allocated: the pool's size

    def allocate(self, nbytes: int) -> int:
        nbytes = max(BLOCK, -(-nbytes // BLOCK) * BLOCK)
        at = self.base
        for pointer, n in sorted(self.allocated.items()):
            if pointer - at >= nbytes:
                break
            at = max(at, pointer + n)
        assert at + nbytes <= self.base + self.whole.numel(), "arena full"
        self.allocated[at] = nbytes
        self.high = max(self.high, at + nbytes - self.base)
        return at

    def tensor(self, pointer: int, like: torch.Tensor) -> torch.Tensor:
        """A tensor over the arena at `pointer` (its storage owning nothing, as the pool's are)."""
        storage = torch._C._construct_storage_from_data_pointer(pointer, torch.device("cpu"),
                                                                self.allocated.get(pointer, BLOCK))
        return torch.empty(0, dtype=like.dtype).set_(storage, 0, like.shape, like.stride())

    def checkpoint(self):
        return dict(self.allocated)

    def restore(self, state) -> None:
        if any(pointer not in state for pointer in self.allocated):
            raise RuntimeError("a block allocated now is free in the checkpoint")
        self.allocated = dict(state)

    def free(self, pointer: int) -> None:
        del self.allocated[pointer]

    def release(self, storage) -> None:
        self.free(storage.data_ptr())

    def live_blocks_are(self, pointers) -> bool:
        return set(self.allocated) == set(pointers)

    def outside(self, pointers) -> set:
        return {p for p in pointers if not self.base <= p < self.base + self.whole.numel()}


class _ArenaPool(SharedPool):
    """A closed pool's memory is the device's again: others write it (its arena scribbled over), so an
    output still held in it would show that."""

    def close(self) -> None:
        super().close()
        self.view.whole.fill_(0xFF)


class _Rerun:
    """A graph stand-in: a replay scribbles over the scratch memory its capture used, then calls
    the graph's function on what the recording reads (its copied inputs' buffers, the caller's
    tensors read in place) and writes the results where its outputs live."""

    def __init__(self, call, scratch=None):
        self.call = call
        self.scratch = scratch
        self.pending = None  # (recording, args) of the replay under way

    def replay(self):
        if self.scratch is not None:
            self.scratch.fill_(0xFF)  # NaN in every float
        recording, args = self.pending
        read = [i.static if i is not None and not i.in_place else a for i, a in zip(recording.inputs, args)]
        for (kind, *rest), value in zip(recording.outputs, self.call(read)):
            if kind == "pool":
                rest[0].copy_(value)


class _RerunRecording(_Recording):
    def replay(self, args):
        self.graph.pending = (self, args)
        return super().replay(args)


class _CpuGraphedCall(GraphedCall):
    recording_type = _RerunRecording

    @staticmethod
    def _all_on_device(args) -> bool:
        return True

    def _warm_up(self, args):
        return self.call(args)

    @staticmethod
    def _shared_pool(device):
        global _pool
        if _pool is None or not _pool.usable:
            _pool = _ArenaPool(_ArenaView())
        return _pool

    _capturing = None  # the pool a capture allocates from

    def _empty(self, size, stride, dtype, device):
        like = torch.empty_strided(size, stride, dtype=dtype)
        if self._capturing is None:
            return like
        view = self._capturing.view
        return view.tensor(view.allocate(like.untyped_storage().nbytes()), like)

    def _capture(self, inputs, args, device, pool):
        self._capturing = pool
        static_args = self._static_args(inputs, args)
        self._capturing = None
        inputs = {a.untyped_storage().data_ptr() for a in static_args if isinstance(a, torch.Tensor)}
        outputs = self.call(list(static_args))
        if pool is None:  # a pool of its own: memory no other recording takes
            return _Rerun(self.call), outputs
        placed = []
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in inputs and out is not _CONSTANT:
                # With the output's strides, as a capture's output has them (a contiguous copy made
                # a later graph that reads it recompile for its strides).
                extent = 1 + sum((n - 1) * s for n, s in zip(out.shape, out.stride())) if out.numel() else 0
                out = pool.view.tensor(pool.view.allocate(extent * out.element_size()), out).copy_(out)
            placed.append(out)
        # Memory the capture used and gave back when it ended: every replay writes it.
        scratch = pool.view.tensor(pool.view.allocate(BLOCK), torch.empty(BLOCK, dtype=torch.uint8))
        pool.view.free(scratch.data_ptr())
        return _Rerun(self.call, scratch), tuple(placed)


_pool = None


@pytest.fixture(autouse=True)
def _fresh_pool(monkeypatch):
    global _pool
    _pool = None
    monkeypatch.setattr(cuda_graphs, "_first_step", cuda_graphs._FirstStep())
    monkeypatch.setattr(cuda_graphs, "_live", [])
    yield
    _pool = None


def _layer(args):
    weight, x = args
    args.clear()  # a boxed call owns its argument list
    with torch.no_grad():  # as AOTAutograd's compiled calls run: no autograd graph holds the inputs
        return (torch.tanh(x @ weight) + x,)


def _graphed():
    return _CpuGraphedCall(_layer, "layer", lambda args: tuple(a.shape for a in args), (), ())


def _weights(n, dim=8):
    return [torch.nn.Parameter(torch.randn(dim, dim) / dim) for _ in range(n)]


class _Arrivals:
    """A loop's fresh input each step, placed as the caching allocator places it on the GPU: the new
    batch is allocated while the last is still alive, so it alternates between two blocks. malloc's
    placement of a fresh CPU tensor varies with what other threads allocated, and an input that moves
    records again: the recording counts the tests below check would flake."""

    def __init__(self, *size):
        self.blocks = [torch.empty(size), torch.empty(size)]
        self.step = 0

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return self.blocks[self.step % 2].copy_(values)


def test_one_graph_called_by_each_layer_replays_a_recording_per_layer():
    call, weights = _graphed(), _weights(4)
    recorded, arrive = [], _Arrivals(3, 8)
    for step in range(5):
        x = arrive(torch.randn(3, 8))
        h, expected = x, x
        replays = call.replays
        for w in weights:
            (h,) = call([w, h])
            expected = torch.tanh(expected @ w) + expected
        torch.testing.assert_close(h, expected)
        del h
        recorded.append(call.recorded)
    # Each layer's recording is kept for it: made in the first two steps, replayed after (every call
    # dropped the other layers' recordings and made its own again: Whisper's training on the H200).
    assert recorded[1] == recorded[4], recorded
    assert call.replays - replays == 4
    # Each layer's first call warms up: the first step runs as usual, the second records each layer
    # once, in order (layers 2-4 recorded in the first step, out of order, and again in the second).
    assert recorded == [0, 4, 4, 4, 4], recorded


def test_a_callers_input_that_moves_is_copied_from_then_on():
    call, (w,) = _graphed(), _weights(1)
    first = torch.randn(3, 8)
    call([w, first])  # warm-up
    (out,) = call([w, first])  # recorded, reading `first` in place: it was there on the warm-up too
    del out
    for _ in range(4):
        x = torch.randn(3, 8)
        (out,) = call([w, x])
        torch.testing.assert_close(out, torch.tanh(x @ w) + x)
        del out
    assert call.copied_always == {1}
    assert sum(len(s.recordings) for s in call.sizes.values()) == 1


def test_held_outputs_are_never_overwritten_and_recordings_stop_at_the_limit():
    call, (w,) = _graphed(), _weights(1)
    inputs = [torch.randn(3, 8) for _ in range(MAX_HELD + 3)]
    outputs = [call([w, x])[0] for x in inputs]  # all held
    for x, out in zip(inputs, outputs):
        torch.testing.assert_close(out, torch.tanh(x @ w) + x)
    assert call.recorded == MAX_HELD


def test_a_loop_that_keeps_the_last_result_settles_with_its_values_kept():
    """Recordings share one pool: a replay writes memory another recording's outputs may occupy. A
    loop that keeps its last result while it calls again (out = model(x) at a script's top level)
    holds the later graph's outputs when the earlier graph runs: the earlier one must not replay a
    recording whose capture had that memory free. With the input moving between two blocks each step,
    each graph records once a step for five steps, then settles: not one recording a call, and the
    earlier graph's recordings stay in the shared pool (each such graph got pools of its own before
    outputs' memory was reused)."""
    first, second, (w1, w2) = _graphed(), _graphed(), _weights(2)
    out, arrive = None, _Arrivals(3, 8)
    for step in range(8):
        x = arrive(torch.randn(3, 8))
        (h,) = first([w1, x])
        (out,) = second([w2, h])  # the last step's `out` was held through this step's first call
        del h
        expected = torch.tanh(x @ w1) + x
        torch.testing.assert_close(out, torch.tanh(expected @ w2) + expected)
        if step == 5:
            made = first.recorded + second.recorded
    recordings = [r for call in (first, second) for s in call.sizes.values() for r in s.recordings]
    assert first.recorded + second.recorded == made, "a recording every call"
    # The graph whose result the loop holds gets one recording in a pool of its own; the other shares.
    assert all(r.shared for s in first.sizes.values() for r in s.recordings)
    assert sum(not r.shared for r in recordings) == 1


def _residual(args):
    x, y = args
    args.clear()
    return (x + y * 2,)


def test_layers_of_two_graphs_in_a_loop_keeping_its_result_settle_and_share_the_pool():
    """tests/gpu's per-layer test on the CPU: each layer calls a graph with its parameters, then one
    without (the rest of the layer, past a graph break), and the loop holds its last result while it
    calls again. The first steps record out of order (a layer warms up while the next records), and
    each recording made again moves its outputs, so the layers after it record again too: settled by
    the sixth step (tests/gpu's test checks the seventh). Only the graph whose result the loop holds gets pools of its
    own (the first graph's recordings share the pool)."""
    first, weights = _graphed(), _weights(4)
    second = _CpuGraphedCall(_residual, "rest", lambda args: tuple(a.shape for a in args), (), ())
    out, recorded, arrive = None, [], _Arrivals(3, 8)
    for step in range(8):
        x = arrive(torch.randn(3, 8))
        h, expected = x, x
        for w in weights:
            (y,) = first([w, h])
            (h,) = second([h, y])
            del y
            expected = expected + 2 * (torch.tanh(expected @ w) + expected)
        out = h  # the last step's result was held through this step
        del h
        torch.testing.assert_close(out, expected)
        recorded.append(first.recorded + second.recorded)
    assert recorded[5] == recorded[7], recorded
    assert all(r.shared for s in first.sizes.values() for r in s.recordings)
    assert any(not r.shared for s in second.sizes.values() for r in s.recordings), "the held result's graph"


def test_a_recordings_output_is_read_in_place_where_a_callers_tensor_once_moved():
    """A position where a caller's own tensor moved is copied from then on, but a recording's output
    passed there later is read in place: it stays where it is from call to call (a warm-up's outputs
    marked the positions of Whisper's backward graphs, which then copied 1 GiB of saved activations
    a step on the H200)."""
    producer, consumer, (w1, w2) = _graphed(), _graphed(), _weights(2)
    first = torch.randn(3, 8)
    for x in (first, first, torch.randn(3, 8)):  # read in place (where it was on the warm-up), then moved
        consumer([w2, x])
    assert consumer.copied_always == {1}
    for _ in range(3):
        x = torch.randn(3, 8)
        (h,) = producer([w1, x])
        (out,) = consumer([w2, h])
        del h
        expected = torch.tanh(x @ w1) + x
        torch.testing.assert_close(out, torch.tanh(expected @ w2) + expected)
    recordings = [r for s in consumer.sizes.values() for r in s.recordings]
    assert any(r.in_place == [(0, w2.data_ptr()), (1, r.inputs[1].pointer)] for r in recordings)
    assert all(not r.copied for r in recordings if (1, r.inputs[1].pointer) in r.in_place)


def _forward(args):
    weight, x = args
    args.clear()
    with torch.no_grad():
        pre = x @ weight
        return (torch.tanh(pre), pre)  # the activation, and what the backward saves


def _backward(args):
    weight, pre, grad = args
    args.clear()
    with torch.no_grad():
        return ((grad * (1 - torch.tanh(pre) ** 2)) @ weight.T,)


def test_a_training_steps_backward_outputs_take_the_memory_of_consumed_activations():
    """Each layer's forward and backward are graphs; the backward consumes what its forward saved.
    An output's memory goes back to the pool once it is dead, so a later capture takes it: the pool
    ends smaller than all the step's outputs together (each recording kept its outputs for good
    before: the activations, held between steps too, and every backward output beside them)."""
    layers = 4
    forward, backward, weights = _graphed(), _graphed(), _weights(layers)
    backward.size_key = lambda args: tuple(a.shape for a in args)
    forward.call, backward.call = _forward, _backward
    for step in range(6):
        x = torch.randn(3, 8)
        h, saved, expected_saved = x, [], []
        for w in weights:
            expected_saved.append(h.detach() @ w.detach())  # no autograd graph holding h
            h, pre = forward([w, h])
            saved.append(pre)
        grad, expected = torch.ones(3, 8), torch.ones(3, 8)
        for w, pre, exact in zip(reversed(weights), reversed(saved), reversed(expected_saved)):
            torch.testing.assert_close(pre, exact)
            (grad,) = backward([w, pre, grad])
            expected = (expected * (1 - torch.tanh(exact) ** 2)) @ w.detach().T
            torch.testing.assert_close(grad, expected)
        del saved, pre, h
    outputs = 2 * layers + layers  # the forwards' activations and saved values, the backwards' gradients
    each = -(-grad.nbytes // BLOCK) * BLOCK
    assert _pool.view.high < outputs * each, (_pool.view.high, outputs * each)
    assert forward.replays > 2 * layers and backward.replays > 2 * layers


def test_a_replay_never_writes_an_output_held_in_memory_its_capture_had_free():
    """A capture takes a dead output's memory. The recording that made that output must not replay
    while the later one's output is held there, nor the later one while the first's is: each
    replay checks that every held output of the pool was held at its capture."""
    first, second, (w1, w2) = _graphed(), _graphed(), _weights(2)
    x = torch.randn(3, 8)
    for _ in range(2):  # warm-up, then recorded: the first's output dead before the second captures
        (a,) = first([w1, x])
        del a
        (b,) = second([w2, x])
        del b
    (b,) = second([w2, x])  # held while the first runs again: the first's memory may hold it
    (a,) = first([w1, x])
    torch.testing.assert_close(b, torch.tanh(x @ w2) + x)
    torch.testing.assert_close(a, torch.tanh(x @ w1) + x)
    (b2,) = second([w2, x])  # and the other way round
    torch.testing.assert_close(a, torch.tanh(x @ w1) + x)
    torch.testing.assert_close(b2, torch.tanh(x @ w2) + x)


def _bias_backward(args):  # a graph each layer's backward calls with no parameter of its own
    (grad,) = args
    args.clear()
    with torch.no_grad():
        return (grad * 2,)


def test_a_backward_each_layer_calls_while_earlier_gradients_are_held_settles_in_the_shared_pool():
    """Autograd keeps each layer's weight gradient (param.grad) while the layers below run their
    backward, so one graph every layer's backward calls (here without parameters: one in-place
    input set) meets a different set of held outputs at each layer. It gets a recording per layer,
    all in the shared pool, settled after the first steps (a recording refused twice for others'
    held outputs once sent their graphs to pools of their own, for good)."""
    layers = 4
    forward, scale, backward, weights = _graphed(), _graphed(), _graphed(), _weights(layers)
    forward.call, scale.call, backward.call = _forward, _bias_backward, _backward
    made, arrive, arrive_grad = [], _Arrivals(3, 8), _Arrivals(3, 8)
    for step in range(6):
        h, saved = arrive(torch.randn(3, 8)), []
        for w in weights:
            h, pre = forward([w, h])
            saved.append(pre)
        grad, expected, grads = arrive_grad(torch.ones(3, 8)), torch.ones(3, 8), []
        for w, pre in zip(reversed(weights), reversed(saved)):
            exact = pre.clone()
            (doubled,) = scale([grad])
            (grad,) = backward([w, pre, doubled])
            del doubled  # autograd frees a gradient once its consumer ran
            grads.append(grad)  # held to the step's end, as param.grad is
            expected = (2 * expected * (1 - torch.tanh(exact) ** 2)) @ w.detach().T
            torch.testing.assert_close(grad, expected)
        del saved, pre, h, grads, grad  # nothing held into the next step
        made.append((forward.recorded, scale.recorded, backward.recorded))
    # The first step warms up, the graph without parameters too (it waits for the layers' graphs to
    # record: recorded while they warmed up, it recorded out of order and again); the second records
    # each graph once a layer, in order; nothing after.
    assert made[0] == (0, 0, 0) and made[1] == (layers,) * 3 and made[5] == made[1], made
    assert all(r.shared for call in (forward, scale, backward) for s in call.sizes.values() for r in s.recordings)


_CONSTANT = torch.arange(8.0)


def _with_a_constant(args):
    (x,) = args
    args.clear()
    with torch.no_grad():
        return (torch.tanh(x), _CONSTANT)


def test_a_constant_the_graph_returns_is_not_given_back_to_the_pool():
    """An output that is no memory of the capture (a constant the compiled graph holds and returns)
    is handed out as itself and never given back to the pool: held with the other outputs across
    calls, nothing overwrites it or them, and the pool's checks keep passing."""
    call = _CpuGraphedCall(_with_a_constant, "constant", lambda args: tuple(a.shape for a in args), (), ())
    kept = []
    for step in range(6):
        x = torch.randn(3, 8)
        y, constant = call([x])
        torch.testing.assert_close(y, torch.tanh(x))
        assert constant.data_ptr() == _CONSTANT.data_ptr()
        kept.append((y, torch.tanh(x)))
        del kept[:-2]
        for value, want in kept:
            torch.testing.assert_close(value, want)
    torch.testing.assert_close(_CONSTANT, torch.arange(8.0))
    assert _pool.usable and call.replays > 2


def test_output_bytes_counts_each_storage_once():
    """cuda_graphs.output_bytes, which the GPU test and probes compare the pool's size with."""
    base = torch.zeros(16)
    made = _Recording(_Rerun(None), [], [("pool", base), ("pool", base[:8]), ("value", 3), ("pool", torch.zeros(4))])
    assert cuda_graphs.output_bytes([made, made]) == 16 * 4 + 4 * 4


def test_a_pool_closes_once_its_calls_are_gone_and_no_output_is_held():
    """The shared pool's memory is the device's again once nothing can use it: while a graphed call
    that recorded into it lives, or one of its outputs is held (a storage pointing into the pool
    without owning it), it stays open and the held value intact; then it closes, its blocks freed."""
    call, (w,) = _graphed(), _weights(1)
    x = torch.randn(3, 8)
    for _ in range(3):
        (out,) = call([w, x])
    pool = _pool
    assert call.replays and pool in cuda_graphs._live and not pool.closed
    assert cuda_graphs.release_idle_pools() == 0  # its call lives
    del call
    gc.collect()
    assert not pool.closed and pool in cuda_graphs._live  # `out` is held
    torch.testing.assert_close(out, torch.tanh(x @ w) + x)
    del out
    assert cuda_graphs.release_idle_pools() == 1
    assert pool.closed and not pool.view.allocated and cuda_graphs._live == []


def test_a_pool_closes_when_its_last_call_is_freed():
    """With no output held, freeing the last graphed call (torch._dynamo.reset(), then nothing
    holding the compiled graph) closes the pool at once: the next call records into a new one."""
    call, (w,) = _graphed(), _weights(1)
    x = torch.randn(3, 8)
    for _ in range(3):
        (out,) = call([w, x])
    del out
    other = _graphed()
    for _ in range(3):
        (out,) = other([w, x])
    del out
    pool = _pool
    del call
    gc.collect()
    assert not pool.closed  # `other` recorded into it too
    del other
    gc.collect()
    assert pool.closed and cuda_graphs._live == []
    again = _graphed()
    for _ in range(3):
        (out,) = again([w, x])
    torch.testing.assert_close(out, torch.tanh(x @ w) + x)
    assert _pool is not pool and cuda_graphs._live == [_pool]


def test_a_reset_closes_the_pool_of_calls_that_outlive_it():
    """Dynamo leaves a compiled function in its module's globals after torch._dynamo.reset(), so the
    garbage collector cannot free its recordings: the reset makes every graphed call forget them,
    and the pool closes once its held outputs die. A call made again records anew, in a new pool."""
    call, (w,) = _graphed(), _weights(1)
    x = torch.randn(3, 8)
    for _ in range(3):
        (out,) = call([w, x])
    pool = _pool
    cuda_graphs.reset()
    assert not pool.closed  # `out` is held
    torch.testing.assert_close(out, torch.tanh(x @ w) + x)
    del out
    cuda_graphs.reset()
    assert pool.closed and cuda_graphs._live == [] and not call.sizes
    for _ in range(3):
        (out,) = call([w, x])
    torch.testing.assert_close(out, torch.tanh(x @ w) + x)
    assert _pool is not pool and call.replays >= 3


def _saves_its_weight(args):  # a forward that saves its weight for the backward, as AOTAutograd's do
    weight, x = args
    args.clear()
    with torch.no_grad():
        return (torch.tanh(x @ weight), weight)


def test_an_input_returned_whole_is_the_callers_tensor_itself():
    """A replay hands back an output that is an input, whole, as the input itself (an ungraphed call
    does): a parameter a forward saves stays a Parameter, so the backward it reaches is told apart by
    it. As a view of it, the backward's callers changed between the forward's warm-up and its replays
    (Whisper's backward graphs recorded once more per layer so)."""
    call, (w,) = _CpuGraphedCall(_saves_its_weight, "saves", lambda args: tuple(a.shape for a in args), (), ()), _weights(1)
    x = torch.randn(3, 8)
    for _ in range(4):
        out, saved = call([w, x])
        torch.testing.assert_close(out, torch.tanh(x @ w.detach()))
        assert saved is w
    assert call.replays >= 2
    sliced = _CpuGraphedCall(lambda a: (a.pop()[1:],), "sliced", lambda args: tuple(a.shape for a in args), (), ())
    for _ in range(4):
        (part,) = sliced([x])
        assert part.data_ptr() == x[1:].data_ptr() and part.shape == (2, 8)


def _forward_saving_weight(args):  # AOTAutograd's forward returns what its backward saves: the weight too
    weight, x = args
    args.clear()
    with torch.no_grad():
        pre = x @ weight
        return (torch.tanh(pre), pre, weight)


def test_a_backward_given_the_weight_its_forward_saved_records_once_a_layer():
    """The backward reaches each layer's weight through its forward's outputs. Replays handed it back
    as a view, no Parameter, while the warm-up had passed the Parameter: the backward's callers
    changed between the first steps and it recorded again (Whisper's backward graphs, 7 recordings
    for 4 layers on the CPU stand-in at this module's faithful strides, 11 on the H200)."""
    layers = 4
    forward, backward, weights = _graphed(), _graphed(), _weights(layers)
    forward.call, backward.call = _forward_saving_weight, _backward
    made, x = [], torch.randn(3, 8)  # one batch every step, as the model suite's
    # The loss's gradient at one address every step, as a recorded loss hands it: a fresh tensor lands
    # where the heap puts it, and one found elsewhere is copied by a recording of its own (under
    # pytest-xdist the first backward so recorded again: a heap state, not the weights this is about).
    ones = torch.ones(3, 8)
    for step in range(5):
        h, saved = x, []
        for w in weights:
            h, pre, kept = forward([w, h])
            saved.append((kept, pre))
        grad = ones
        for (kept, pre), w in zip(reversed(saved), reversed(weights)):
            expected = (grad * (1 - torch.tanh(pre) ** 2)) @ w.detach().T
            (grad,) = backward([kept, pre, grad])
            torch.testing.assert_close(grad, expected)
        del saved, kept, pre, h, grad  # nothing held into the next step
        made.append((forward.recorded, backward.recorded))
    assert made[-1] == made[1] == (layers, layers), made


def _mask(args):  # a step's first graph, told apart by no parameter (OPT's attention mask)
    (x,) = args
    args.clear()
    with torch.no_grad():
        return (x * 0.5,)


def test_a_steps_first_graph_without_parameters_records_with_the_others():
    """The first graph of each step takes no parameter. It waited for the first step's end, which only
    the layers' graphs told, after it had run: so it recorded a step late, its outputs moved, and every
    layer's graph reading them recorded again (OPT on the CPU stand-in). Its own second call ends the
    first step now."""
    layers = 3
    mask = _CpuGraphedCall(_mask, "mask", lambda args: tuple(a.shape for a in args), (), ())
    forward, weights = _graphed(), _weights(layers)
    x, made = torch.randn(3, 8), []
    for step in range(4):
        (h,) = mask([x])
        for w in weights:
            (h,) = forward([w, h])
        torch.testing.assert_close(h, _reference(x * 0.5, weights))
        del h
        made.append((mask.recorded, forward.recorded))
    assert made[1] == made[-1] == (1, layers), made


def _reference(x, weights):
    h = x
    for w in weights:
        h = torch.tanh(h @ w.detach()) + h
    return h
