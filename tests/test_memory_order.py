"""Kernels run where their inputs die, not later: outputs computed in program order
(lowering/graph.py) and combo members that move back only where memory cannot grow
(scheduler/combo.py). Qwen2's AMP backward held every bfloat16 weight gradient and norm input
until its last kernel, which made all their float32 casts and column sums at once."""
import pytest
import torch

import smelt
from conftest import DEVICE, inspects_triton_kernels

pytestmark = pytest.mark.smelt_only


def _compiled(fn, *args, observe):
    torch._dynamo.reset()
    observe.reset()
    out = torch.compile(fn, backend="smelt")(*args)
    return out, observe.compiled_graphs()[-1]


def _slices_of_products(a, b, c, d):
    # Each scaled slice is an output only: left for the output node, all three products would live
    # to the end (as a backward's weight gradients did before their float32 casts).
    return (a @ b)[:, :8] * 2, (a @ c)[:, :8] * 2, (a @ d)[:, :8] * 2


def test_an_output_is_computed_where_the_program_computes_it(observe, monkeypatch):
    a, b, c, d = (torch.randn(64, 64, device=DEVICE) for _ in range(4))
    out, graph = _compiled(_slices_of_products, a, b, c, d, observe=observe)
    for got, want in zip(out, _slices_of_products(a, b, c, d)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    product = 64 * 64 * 4
    assert graph.planned_peak_bytes < 2 * product  # one product alive at a time, beside the small slices
    peak_line = next(line for line in graph.wrapper_source.splitlines() if line.startswith("PLANNED_PEAK_BYTES"))
    assert "16.0 KiB" in peak_line.split("at once:")[1]  # the wrapper names the peak's buffers: the product
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    monkeypatch.setattr(smelt.lowering.graph, "_realize_output_in_place", lambda *a: None)
    _, deferred = _compiled(_slices_of_products, a, b, c, d, observe=observe)
    assert deferred.planned_peak_bytes >= 3 * product  # the test fails without the change


def _fills_around_a_temporary(x):
    first = torch.zeros(1 << 19, device=x.device)  # 2 MiB each: larger than combo.MOVE_BYTES
    total = (x @ x).relu().sum()  # a 1 MiB temporary between the two fills
    second = torch.zeros(1 << 19, device=x.device)
    return first, total, second


def test_a_combo_member_does_not_move_back_to_allocate_earlier(observe, monkeypatch):
    x = torch.randn(512, 512, device=DEVICE)
    out, graph = _compiled(_fills_around_a_temporary, x, observe=observe)
    for got, want in zip(out, _fills_around_a_temporary(x)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
    inspects_triton_kernels()
    fill, temporary = 4 << 19, 4 << 18
    assert graph.planned_peak_bytes <= 2 * fill + 64  # the second fill after the temporary has died
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    monkeypatch.setattr(smelt.scheduler.combo, "MOVE_BYTES", 1 << 40)
    _, moved = _compiled(_fills_around_a_temporary, x, observe=observe)
    assert moved.planned_peak_bytes >= 2 * fill + temporary  # the test fails without the rule


def _scaled_weights_then_a_temporary(x, w1, w2):
    first = w1 * 2  # 2 MiB each: two kernels of one body (a forward's weight casts)
    small = x[:8].sin().sum()
    second = w2 * 2
    total = (x @ x).relu().sum()  # the peak comes later, with both scaled weights alive anyway
    return first, small, second, total


def test_a_combo_member_moves_back_where_the_peak_allows(observe):
    x, w1, w2 = torch.randn(512, 512, device=DEVICE), torch.randn(1 << 19, device=DEVICE), \
        torch.randn(1 << 19, device=DEVICE)
    out, graph = _compiled(_scaled_weights_then_a_temporary, x, w1, w2, observe=observe)
    for got, want in zip(out, _scaled_weights_then_a_temporary(x, w1, w2)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
    inspects_triton_kernels()
    launches = [line.strip() for line in graph.wrapper_source.splitlines() if line.strip().startswith("triton_")]
    assert len(launches) == 3 and launches[0].startswith("triton_combo"), launches  # both scalings in one
