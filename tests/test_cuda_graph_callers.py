"""Which recording a CUDA-graphed call replays, and when it records (runtime/cuda_graphs.py), on the
CPU: the capture is a stand-in that reruns the call, so the bookkeeping around it (in-place inputs,
held outputs, one graph called by several layers) is tested without a GPU. tests/gpu/test_cuda_graphs.py
runs the same rules through real CUDA graphs."""
import torch

from smelt.runtime.cuda_graphs import MAX_HELD, GraphedCall, _Recording


class _Rerun:
    """A graph stand-in: a replay calls the graph's function again."""

    def __init__(self, call):
        self.call = call

    def replay(self):
        pass


class _RerunRecording(_Recording):
    def replay(self, args):
        fresh = self.graph.call(list(args))
        for (kind, *rest), value in zip(self.outputs, fresh):
            if kind == "pool":
                rest[0].copy_(value)  # where a CUDA graph's replay writes its outputs
        return super().replay(args)


class _CpuGraphedCall(GraphedCall):
    recording_type = _RerunRecording

    @staticmethod
    def _all_on_device(args) -> bool:
        return True

    def _warm_up(self, args):
        return self.call(args)

    def _capture(self, static_args, device, shared):
        return _Rerun(self.call), self.call(static_args)


def _layer(args):
    weight, x = args
    args.clear()  # a boxed call owns its argument list
    with torch.no_grad():  # as AOTAutograd's compiled calls run: no autograd graph holds the inputs
        return (torch.tanh(x @ weight) + x,)


def _graphed():
    return _CpuGraphedCall(_layer, "layer", lambda args: tuple(a.shape for a in args), (), ())


def _weights(n, dim=8):
    return [torch.nn.Parameter(torch.randn(dim, dim) / dim) for _ in range(n)]


def test_one_graph_called_by_each_layer_replays_a_recording_per_layer():
    call, weights = _graphed(), _weights(4)
    recorded = []
    for step in range(5):
        x = torch.randn(3, 8)
        h, expected = x, x
        for w in weights:
            (h,) = call([w, h])
            expected = torch.tanh(expected @ w) + expected
        torch.testing.assert_close(h, expected)
        del h
        recorded.append(call.recorded)
    # Each layer's recording is kept for it: made in the first two steps, replayed after (every call
    # dropped the other layers' recordings and made its own again: Whisper's training on the H200).
    assert recorded[1] == recorded[4], recorded
    assert sum(len(s.recordings) for s in call.sizes.values()) == 4


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


def test_a_loop_that_keeps_the_last_result_gets_recordings_that_no_other_writes():
    """Recordings share one pool: a replay writes memory a later recording's outputs may occupy. A
    loop that keeps its last result while it calls again (out = model(x) at a script's top level)
    holds the later graph's outputs when the earlier graph runs: the earlier one must not replay its
    shared recording then, and its next recording gets a pool of its own (not one recording a call)."""
    first, second, (w1, w2) = _graphed(), _graphed(), _weights(2)
    out = None
    for step in range(8):
        x = torch.randn(3, 8)
        (h,) = first([w1, x])
        (out,) = second([w2, h])  # the last step's `out` was held through this step's first call
        del h
        expected = torch.tanh(x @ w1) + x
        torch.testing.assert_close(out, torch.tanh(expected @ w2) + expected)
        if step == 5:
            made = first.recorded + second.recorded
    recordings = [r for call in (first, second) for s in call.sizes.values() for r in s.recordings]
    assert first.recorded + second.recorded == made, "a recording every call"
    assert any(not r.shared for r in recordings), "the first graph's later recording shares the pool"


def _residual(args):
    x, y = args
    args.clear()
    return (x + y * 2,)


def test_layers_of_two_graphs_in_a_loop_keeping_its_result_settle_and_share_the_pool():
    """tests/gpu's per-layer test on the CPU: each layer calls a graph with its parameters, then one
    without (the rest of the layer, past a graph break), and the loop holds its last result while it
    calls again. The first steps record out of order (a layer warms up while the next records), and
    each recording made again moves its outputs, so the layers after it record again too: settled by
    the fifth step (the GPU's count too). Only the graph whose result the loop holds gets pools of its
    own: a recording refused for another's held output that is its own input (data flow) no longer
    retires that one (each layer's graph went private so)."""
    first, weights = _graphed(), _weights(4)
    second = _CpuGraphedCall(_residual, "rest", lambda args: tuple(a.shape for a in args), (), ())
    out, recorded = None, []
    for step in range(7):
        x = torch.randn(3, 8)
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
    assert recorded[4] == recorded[6], recorded
    assert all(r.shared for s in first.sizes.values() for r in s.recordings)
    assert not any(r.shared for s in second.sizes.values() for r in s.recordings)


def test_a_later_recordings_output_passed_in_is_data_flow_not_a_held_result():
    """An earlier recording refused a second time for a later one's held output retires the later one
    (a loop's kept result) unless that output is an argument of this call: then the producer ran
    after it in this call's own chain (on the GPU a producer recorded again lands at its old address,
    so the consumer's in-place check passes), and retiring it would put a layer's graph into pools of
    its own for good."""
    from smelt.runtime import cuda_graphs

    def recording(output):
        made = _Recording(_Rerun(None), [], [("pool", output)])
        made.recorded_again = True
        return made

    consumer = recording(torch.zeros(4))
    producer_output = torch.zeros(4)
    producer = recording(producer_output)
    cuda_graphs._handed_out[id(producer)] = producer
    held = producer_output.view(-1)  # held outside the recording, as a caller's argument is
    try:
        assert not consumer.fits([held]) and consumer.refusal == "later"
        assert not producer.retired
        assert not consumer.fits([torch.zeros(4)])
        assert producer.retired
    finally:
        cuda_graphs._handed_out.pop(id(producer), None)


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
