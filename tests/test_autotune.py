"""Autotuning: candidates timed on the first launch, the winner cached on disk and reused."""

import glob
import os

import pytest
import torch

from smelt.codegen.triton import combo as triton_combo
from smelt.runtime.autotune import Autotuner
from smelt.runtime.combo_launcher import ComboLauncher
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


def test_a_tuned_kernel_written_over_its_own_input_times_on_copies(tuning, device, compile_fn, observe,
                                                                     assert_close):
    """The memory plan puts relu's result over the product it reads (scheduler/reuse.py): each trial
    launch would read what the one before it wrote (relu(y) * 2, then 4 * relu(y), ...)."""
    folder, timed = tuning

    def f(x, w, head):
        return ((x @ w).relu() * 2) @ head
    x, w, head = (torch.randn(64, 64, device=device), torch.randn(64, 64, device=device),
                  torch.randn(64, 4, device=device))
    assert_close(compile_fn(f)(x, w, head), f(x, w, head))
    inspects_triton_kernels()
    assert len(timed) > 1
    assert "written over" in observe.compiled_graphs()[-1].wrapper_source


def test_a_tiled_kernel_is_tuned_over_tiles_and_reads_its_tile_back(tuning, device, compile_fn, observe,
                                                                     assert_close):
    """A transposed read (a tiled kernel): tiles of other shapes timed, the winner's tile kept on disk and
    taken by a second compile without timing anything; every candidate gives eager's values."""
    folder, timed = tuning

    def f(x, y):
        return x.t() * 2 + y
    x, y = torch.randn(300, 200, device=device), torch.randn(200, 300, device=device)
    assert_close(compile_fn(f)(x, y), f(x, y))
    inspects_triton_kernels()
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    assert any("autotuned over" in s and "roffset = tl.program_id" in s for s in sources), sources
    assert len(timed) > 2
    entries = [open(p).read() for p in glob.glob(os.path.join(folder, "autotune", "*.json"))]
    assert any('"tiles"' in e for e in entries), entries
    torch._dynamo.reset()
    timed.clear()
    assert_close(compile_fn(f)(x, y), f(x, y))
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


def test_combo_is_tuned_as_a_whole_and_its_in_place_updates_apply_once(tuning, device, compile_fn, observe,
                                                                       monkeypatch):
    # The trials store into copies: the parameters take the update once, not once per trial.
    folder, timed = tuning
    monkeypatch.setattr(triton_combo, "TUNE_MIN_ELEMENTS", 0)  # tune these small combos too
    sizes = (3000, 5000, 700, 4096, 10)
    params = [torch.randn(n, device=device) for n in sizes]
    grads = [torch.randn(n, device=device) for n in sizes]
    sums = [torch.randn(n, 6, device=device) for n in sizes]
    expected = [p - 0.1 * g for p, g in zip(params, grads)]

    def step(params, grads, sums):
        for p, g in zip(params, grads):
            p.sub_(g, alpha=0.1)
        return [s.sum(-1) for s in sums]

    reduced = compile_fn(step)(params, grads, sums)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p, e)
    for r, s in zip(reduced, sums):
        torch.testing.assert_close(r, s.sum(-1))
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    combos = [s for name, s in graph.kernel_sources.items() if "combo" in name]
    assert combos and all("autotuned over" in s for s in combos), graph.kernel_names
    assert len(timed) > len(combos), "each combo's candidates should have been timed"

    # Another process's compile reads each combo's choice from disk, and its update still applies once.
    torch._dynamo.reset()
    timed.clear()
    copied = []
    timing = ComboLauncher._time_candidates
    monkeypatch.setattr(ComboLauncher, "_time_candidates", lambda *a: copied.append(1) or timing(*a))
    expected = [p - 0.1 * g for p, g in zip(params, grads)]
    compile_fn(step)(params, grads, sums)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p, e)
    assert timed == []
    assert copied == [], "a combo whose choice is on disk should not copy its buffers"


def test_a_launch_bound_combo_is_not_tuned(tuning, device, compile_fn, observe, assert_close):
    _, timed = tuning
    xs = [torch.randn(n, device=device) for n in (3000, 5000, 700)]

    def fn(xs):
        return [torch.sigmoid(x) * 3 for x in xs]

    assert_close(compile_fn(fn)(xs), fn(xs))
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    combos = [s for name, s in graph.kernel_sources.items() if "combo" in name]
    assert combos and not any("autotuned over" in s for s in combos), graph.kernel_names
    assert timed == []


def test_a_candidate_within_noise_of_the_heuristics_does_not_replace_it(tmp_path, monkeypatch):
    """The heuristic's config (the first) stays unless another times 3% faster: timings of small
    kernels differ by noise, and a pick by noise was slower in the model (EfficientNet, H200)."""
    configs = ["heuristic", "close", "far"]
    tuner = Autotuner("source", configs, str(tmp_path), "kernel")
    timings = {"heuristic": 1.0, "close": 0.98, "far": 1.5}
    monkeypatch.setattr(Autotuner, "_time", staticmethod(lambda fn, device: timings[fn()]))
    monkeypatch.setattr(tuner, "_write", lambda path, config: None)
    assert tuner.pick((1,), torch.device("cpu"), lambda c: c) == "heuristic"
    timings["far"] = 0.9
    assert tuner.pick((2,), torch.device("cpu"), lambda c: c) == "far"


class _FakeEvent:
    """torch.cuda.Event on a pretend GPU: every launch takes `each` ms, and `woke` says whether the
    sleep before the launches had ended by the time they were all queued. The first event made is
    the start: launches count from its record."""
    each, woke, launched, made = 1e-5, False, 0, []

    def __init__(self, enable_timing=False):
        _FakeEvent.made.append(self)

    def record(self):
        if self is _FakeEvent.made[0]:
            _FakeEvent.launched = 0

    def synchronize(self):
        pass

    def query(self):
        return _FakeEvent.woke

    def elapsed_time(self, other):
        return _FakeEvent.each * _FakeEvent.launched


@pytest.mark.parametrize("woke", [False, True])
def test_queued_timing_doubles_its_sleep_only_while_the_host_falls_behind(monkeypatch, woke):
    """autotune._queued's loop on a pretend GPU (tests/gpu/test_autotune_timing.py runs it on a real
    one): launches queued in time are timed at once; a host that never keeps up (100 Python calls
    take longer than the pretend GPU's 1 ns launches) doubles the sleep up to 200 ms, then takes the
    time it has rather than sleeping for ever."""
    from smelt.runtime import autotune
    sleeps = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(autotune, "_cycles", {0: 2e6})  # a 2 GHz clock
    monkeypatch.setattr(_FakeEvent, "made", [])
    monkeypatch.setattr(_FakeEvent, "woke", woke)

    def launch():
        _FakeEvent.launched += 1
    assert autotune._queued(launch) == pytest.approx(_FakeEvent.each)
    if woke:
        assert 200 * 2e6 <= sleeps[-1] < 400 * 2e6 and sleeps == sorted(sleeps)
    else:
        assert len(sleeps) == 3 and len(set(sleeps)) == 1


def test_row_candidates_are_the_heuristic_then_fewer_warps_and_one_row_a_program():
    """BERT's residual + LayerNorm (4096 x 768): the heuristic's 4 rows over 4 warps, then 2048 and
    4096 elements a warp, then one row a program (Inductor's tuner takes one warp there)."""
    from types import SimpleNamespace
    from smelt.artifact import BlockConfig
    from smelt.codegen.triton.candidates import row_candidates

    def plan(rows, width, per_element=True):
        return SimpleNamespace(static_sizes=lambda: (rows, width), has_scan=False, r_contiguous=lambda: True,
                               stores_per_element=lambda: per_element)
    heuristic = BlockConfig(4, 1024, 4, True)
    found = [(c.XBLOCK, c.num_warps) for c in row_candidates(plan(4096, 768), heuristic)]
    assert found == [(4, 4), (4, 2), (4, 1), (1, 1)]
    assert row_candidates(plan(4096, 768, per_element=False), heuristic) == [heuristic]  # a row's statistics
    looped = BlockConfig(1, 2048, 4, False)
    assert row_candidates(plan(64, 100000), looped) == [looped]
    short = BlockConfig(8, 64, 2, True)
    assert row_candidates(plan(4096, 64), short) == [short]
