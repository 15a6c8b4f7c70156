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
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    alone = start.elapsed_time(end)
    assert _queued(lambda: torch.cuda._sleep(cycles)) == pytest.approx(alone, rel=0.2)
