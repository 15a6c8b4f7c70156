"""Autotuning: candidates timed on the first launch, the winner cached on disk and reused."""

import glob
import os

import pytest
import torch

from smelt.runtime.autotune import Autotuner
from conftest import inspects_triton_kernels

pytestmark = pytest.mark.smelt_only


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    monkeypatch.setenv("SMELT_AUTOTUNE", "1")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path))
    timed = []
    original = Autotuner._time

    def counting(fn, device):
        timed.append(device)
        return original(fn, device)
    monkeypatch.setattr(Autotuner, "_time", staticmethod(counting))
    return tmp_path, timed


def _softmax(x):
    return torch.softmax(x, dim=-1) * 2


def test_tuned_kernel_matches_eager_and_caches_its_choice(tuning, device, compile_fn, observe, assert_close):
    folder, timed = tuning
    x = torch.randn(37, 300, device=device)
    assert_close(compile_fn(_softmax)(x), _softmax(x))
    inspects_triton_kernels()
    assert len(timed) > 1, "more than one candidate should have been timed"
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    assert any("autotuned over" in s for s in sources)
    assert glob.glob(os.path.join(folder, "autotune", "*.json"))

    # A second compile of the same kernel (as in a new process) reads the choice from disk.
    torch._dynamo.reset()
    timed.clear()
    assert_close(compile_fn(_softmax)(x), _softmax(x))
    assert timed == []


def test_unreadable_cache_entry_is_timed_again(tuning, device, compile_fn, assert_close):
    folder, timed = tuning
    x = torch.randn(16, 200, device=device)
    compile_fn(_softmax)(x)
    for path in glob.glob(os.path.join(folder, "autotune", "*.json")):
        with open(path, "w") as f:
            f.write("{not json")
    torch._dynamo.reset()
    timed.clear()
    assert_close(compile_fn(_softmax)(x), _softmax(x))
    inspects_triton_kernels()
    assert len(timed) > 1


def test_in_place_update_is_not_tuned(tuning, device, compile_fn):
    # Timing runs a kernel many times: one that writes its input would add many times over.
    _, timed = tuning
    x = torch.zeros(1000, device=device)
    compile_fn(lambda x: x.add_(1))(x)
    assert torch.equal(x, torch.ones_like(x))
    assert timed == []
