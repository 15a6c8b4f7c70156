"""One compiled CUDA graph called from several threads at once (the Halide launcher's shared
descriptions gave wrong answers on the CPU that way: tests/test_cpu_workspace.py): kernels whose
launchers keep state between calls (combo kernels' pointer tables, a finisher's counter), each
thread on its own stream, against eager."""

import pytest
import torch
import torch.nn.functional as F
from conftest import failures_in_threads

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _program(x, w, ys):
    # A product, a norm, and independent small reductions that share a combo launch.
    h = F.layer_norm(x @ w, (w.shape[1],))
    return h.relu().sum(0), [y.square().sum() for y in ys]


def test_threads_on_their_own_streams_get_their_own_answers():
    torch._dynamo.reset()
    compiled = torch.compile(_program, backend="smelt")

    def inputs(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(256, 64, device="cuda", generator=g), torch.randn(64, 128, device="cuda", generator=g),
                [torch.randn(100 + 7 * i, device="cuda", generator=g) for i in range(6)])

    compiled(*inputs(0))  # compiled once, before the threads
    torch.cuda.synchronize()

    def worker(k):
        seed = k + 1
        args = inputs(seed)
        expected = _program(*args)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())  # the inputs and the expected values
        with torch.cuda.stream(stream):
            for _ in range(30):
                got = compiled(*args)
                stream.synchronize()
                assert torch.allclose(got[0], expected[0], atol=1e-3, rtol=1e-3) and all(
                    torch.allclose(a, b, atol=1e-3, rtol=1e-3) for a, b in zip(got[1], expected[1])), "wrong values"
    failures = failures_in_threads(worker, 4)
    assert not failures, failures
