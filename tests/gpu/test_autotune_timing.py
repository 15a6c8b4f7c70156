"""How autotuning times a candidate on the GPU (smelt/runtime/autotune.py's _queued): GPU time alone,
not the host's launch path, so a kernel of a few microseconds is not timed at the host's cost."""
import time

import pytest
import torch

from smelt.runtime.autotune import _queued

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_tiny_kernel_times_under_its_host_launch_cost():
    x = torch.zeros(1024, device="cuda")

    def launch():  # a few microseconds of GPU time behind a slow host path
        time.sleep(50e-6)
        x.add_(1)
    gpu_ms = _queued(launch)
    assert gpu_ms < 0.02, gpu_ms  # the host path alone takes over 0.05 ms a launch


def test_a_known_gpu_time_is_measured():
    cycles = 2_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # the sleep kernel loaded and the clock up before the reference
    alone = []
    for _ in range(5):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        alone.append(start.elapsed_time(end))
    assert _queued(lambda: torch.cuda._sleep(cycles)) == pytest.approx(sorted(alone)[2], rel=0.2)


def test_a_launch_that_waits_for_the_gpu_ends_with_a_time():
    """A launch path that synchronizes leaves no launch queued behind the sleep: the timing gives up
    doubling it (at 200 ms) rather than sleeping for ever."""
    x = torch.zeros(1024, device="cuda")

    def launch():
        x.add_(1)
        torch.cuda.synchronize()
    assert _queued(launch, rounds=1) > 0
