"""A reduction and the small reduction of its results in one launch: the last program finishes
(smelt/codegen/triton/finisher.py)."""
import pytest
import torch

import smelt.scheduler.finishers
from conftest import inspects_triton_kernels

TOL = dict(rtol=1e-4, atol=1e-3)


def _sources(observe) -> list[str]:
    inspects_triton_kernels()
    return [src for g in observe.compiled_graphs() for src in g.kernel_sources.values()]


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setenv("SMELT_SPLIT_REDUCTION_MIN_NUMEL", "1000")


def test_global_sum_is_one_launch_whose_last_program_adds_the_partials(device, compile_fn, observe, split_small):
    x = torch.randn(20_011, device=device)
    f = compile_fn(lambda x: x.sum())
    # Each launch must leave the ticket counter at zero for the next, with new values each time.
    for _ in range(3):
        x = torch.randn(20_011, device=device)
        torch.testing.assert_close(f(x), x.double().sum().float(), **TOL)
    (source,) = _sources(observe)
    assert "ticket = tl.atomic_add(ticket_ptr, 1, sem='acq_rel')" in source, source
    assert "cache_modifier='.cg'" in source.split("_finish0(")[1], source  # partials read through L2


def test_reduction_of_per_row_results_and_its_epilogue(device, check, observe):
    x = torch.randn(67, 300, device=device)
    check(lambda x: x.sum(1).amax() * 2 + 1, x, **TOL)
    (source,) = _sources(observe)
    assert "_finish0(" in source and "* 2" not in source.split("@triton.jit")[-1].split("ticket =")[0], source


def test_several_global_reductions_of_one_input_are_one_launch(device, check, observe, split_small):
    # Each split reduction's second stage is a finisher of the one first-stage kernel they share.
    check(lambda x: (x.abs().mean(), x.amax(), torch.var_mean(x)), torch.randn(3001, device=device), **TOL)
    (source,) = _sources(observe)
    assert "_finish0(" in source and "_finish2(" in source, source


def test_too_many_partials_keep_a_second_kernel(device, check, observe, split_small, monkeypatch):
    monkeypatch.setenv("SMELT_FINISH_LIMIT", "4")
    check(lambda x: x.sum(), torch.randn(20_011, device=device), **TOL)
    sources = _sources(observe)
    assert len(sources) == 2 and not any("ticket_ptr" in s for s in sources), sources


def test_a_column_sums_partials_are_finished_in_wide_tiles(device, check, observe):
    # One program walks the finisher's blocks one after another: a [16, 1024] grid of partials in
    # tiles of up to 16384 elements (one step), not the standalone GPU kernel's 64 columns (16). Run
    # with SMELT_TEST_DEVICE=cuda to check that: the interpreter's blocks are that wide anyway.
    x, w = torch.randn(4096, 1024, device=device), torch.randn(4096, 1, device=device)
    check(lambda x, w: (x * w).sum(0), x, w, **TOL)
    (source,) = _sources(observe)
    assert "_finish0(" in source, source
    steps = [line for line in source.splitlines() if "for pid in range(0, " in line]
    assert all(int(line.split("range(0, ")[1].split(")")[0]) <= 1
                         for line in steps), steps  # one step: printed with no loop, or a loop of one


def test_a_small_product_of_the_results_finishes_reading_its_weight(device, check, observe):
    # A squeeze-excite gate: the pool's per-channel means, then two small products of them read
    # their weights and bias (stored before the launch) beside the results: all in one launch.
    x, w1, b1, w2 = (torch.randn(4, 12, 9, 9, device=device), torch.randn(3, 12, device=device),
                     torch.randn(3, device=device), torch.randn(12, 3, device=device))

    def gate(x, w1, b1, w2):
        s = torch.nn.functional.silu((x.mean((2, 3)).unsqueeze(1) * w1).sum(-1) + b1)
        return (s.unsqueeze(1) * w2).sum(-1)
    check(gate, x, w1, b1, w2, **TOL)
    (source,) = _sources(observe)
    assert "_finish1(" in source, source


def test_a_finisher_does_not_gather_from_a_big_tensor(device, check, observe, monkeypatch):
    # Row maxima, then a sum of the values picked from another big tensor: that read is a gather
    # the finishing program would make alone (cross entropy's loss, measured slower so on an H100).
    x, y = torch.randn(64, 300, device=device), torch.randn(64, 300, device=device)
    monkeypatch.setattr(smelt.scheduler.finishers, "OTHER_READ_BYTES", 0.01)  # y: 76,800 bytes
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")  # the constant is not part of a graph's key
    check(lambda x, y: y.gather(1, x.argmax(1, keepdim=True)).sum(), x, y, **TOL)
    sources = _sources(observe)
    assert not any("_finish0(" in s for s in sources), sources


def test_a_finisher_reads_a_cat_the_launch_filled_through_l2(device, check, observe):
    # The big kernel writes the cat's slices; the finisher loads the cat by its storage's name. Those
    # stores are other programs' of the same launch: read through L2 (.cg), not from a stale L1 line.
    x, ys = torch.randn(256, 300, device=device), [torch.randn(256, device=device) for _ in range(9)]

    def f(x, ys):
        m = x.sum(1)
        c = torch.cat([m] + [y * 2 for y in ys])
        return (c.view(len(ys) + 1, -1) * m[None, :]).sum(), c
    check(f, x, ys, **TOL)
    (source,) = _sources(observe)
    finish = source.split("_finish0(")[1].split("@triton.jit")[0]
    loads = [line for line in finish.splitlines() if "tl.load(" in line]
    assert len(loads) == 2 and all("cache_modifier='.cg'" in line for line in loads), finish
