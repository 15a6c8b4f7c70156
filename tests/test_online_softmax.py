"""Online softmax: a row's max and sum of exp(x - max) in one pass (smelt/lowering/online_softmax.py).

Rows are forced to loop over r (SMELT_PERSISTENT_REDUCTION_LIMIT below the row length), with row
lengths that are not a multiple of the block, so the running rescale, the masked tail and the
merge of lanes all run. The interpreter is slow: tensors stay small.
"""
import re

import pytest
import torch
import torch.nn.functional as F

import smelt.scheduler.finishers
from conftest import allocated_shapes, inspects_triton_kernels

LOOPED_LIMIT = "64"
ROW = 300  # > LOOPED_LIMIT, not a multiple of the interpreter's RBLOCK (128)


@pytest.fixture
def looped(monkeypatch):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", LOOPED_LIMIT)


def _with_minus_inf_rows(x):
    """Row 0 all -inf, row 1 -inf everywhere but one element, row 2 -inf over its first blocks
    (lanes that see only -inf for a while), row 3 scattered -inf, the other rows finite."""
    x = x.clone()
    x[0] = float("-inf")
    x[1] = float("-inf")
    x[1, ROW - 7] = 1.5
    x[2, : ROW - 20] = float("-inf")
    x[3, ::3] = float("-inf")
    return x


def _loop_count(source: str) -> int:
    return len(re.findall(r"^\s*for roffset in range", source, flags=re.M))


def _kernels(observe):
    inspects_triton_kernels()
    return {name: src for g in observe.compiled_graphs() for name, src in g.kernel_sources.items()}


def _allocated_shapes(observe):
    return [shape for g in observe.compiled_graphs() for shape in allocated_shapes(g.wrapper_source)]


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_looped_rows(fn, looped, device, check):
    x = torch.randn(6, ROW, device=device) * 4
    check(lambda x: fn(x, dim=-1), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("persistent", [False, True], ids=["looped", "persistent"])
def test_rows_with_minus_inf(fn, persistent, monkeypatch, device, check):
    if not persistent:
        monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", LOOPED_LIMIT)
    x = _with_minus_inf_rows(torch.randn(6, ROW, device=device) * 4)
    actual, expected = check(lambda x: fn(x, dim=-1), x, atol=1e-5, rtol=1e-5)
    assert expected[0].isnan().all()  # eager's all -inf row, which check matched NaN for NaN
    assert torch.isfinite(actual[2:]).any(dim=-1).all()


def test_row_with_nan_and_inf(looped, device, check):
    x = torch.randn(4, ROW, device=device)
    x[0, 200] = float("nan")
    x[1, 5] = float("inf")
    x[2, 150] = float("inf")
    x[2, 151] = float("-inf")
    check(lambda x: F.softmax(x, dim=-1), x, atol=1e-5, rtol=1e-5)


def test_large_logits_stay_stable(looped, device, check):
    x = torch.randn(3, ROW, device=device) * 10 + 500.0
    x[:, 250:] += 300.0  # the max grows late in the row: the running sum is rescaled
    actual, _ = check(lambda x: F.softmax(x, dim=-1), x, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(actual).all()


@pytest.mark.parametrize("dim", [0, 1], ids=["dim0", "dim1"])
def test_rows_along_other_dims(dim, looped, device, check):
    x = torch.randn(ROW, 5, 3, device=device).movedim(0, dim).contiguous() * 3
    check(lambda x: F.log_softmax(x, dim=dim), x, atol=1e-5, rtol=1e-5)


def test_bf16_softmax(looped, device, check):
    x = (torch.randn(5, ROW, device=device) * 3).to(torch.bfloat16)
    check(lambda x: F.softmax(x, dim=-1), x)


def test_hand_written_logsumexp_without_keepdim(looped, device, check):
    def lse(x):
        m = x.amax(-1, keepdim=True)
        return m.squeeze(-1) + (x - m).exp().sum(-1).log()
    check(lse, torch.randn(5, ROW, device=device) * 3, atol=1e-5, rtol=1e-5)


def test_float64_rows(looped, device, check):
    x = torch.randn(3, ROW, device=device, dtype=torch.float64) * 5
    check(lambda x: F.log_softmax(x, dim=-1), x)


def test_sum_over_other_dims_is_not_fused(looped, device, check, observe):
    # sum(exp(x - amax)) over a dim other than amax's: two ordinary reductions, still correct.
    def f(x):
        m = x.amax(-1, keepdim=True)
        return (x - m).exp().sum(0)
    check(f, torch.randn(4, ROW, device=device), atol=1e-5, rtol=1e-5)
    assert not any("_online_max" in s for s in _kernels(observe).values())


@pytest.mark.parametrize("reduction", ["mean", "none", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cross_entropy(reduction, dtype, looped, device, check):
    logits = (torch.randn(7, ROW, device=device) * 3).to(dtype)
    target = torch.randint(0, ROW, (7,), device=device)
    target[2] = -100  # the default ignore_index
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {}  # bf16: conftest's 1e-2
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), logits, target, **tol)


def test_cross_entropy_custom_ignore_index(looped, device, check):
    logits = torch.randn(6, ROW, device=device) * 3
    target = torch.randint(0, ROW, (6,), device=device)
    target[[1, 4]] = 5
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=5), logits, target, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cross_entropy_label_smoothing(dtype, looped, device, check):
    logits = (torch.randn(6, ROW, device=device) * 3).to(dtype)
    target = torch.randint(0, ROW, (6,), device=device)
    target[0] = -100
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {}  # bf16: conftest's 1e-2
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), logits, target, **tol)


def test_log_softmax_row_sum(looped, device, check):
    x = torch.randn(5, ROW, device=device) * 3
    x[1, 10] = float("-inf")
    x[2] = float("-inf")
    check(lambda x: F.log_softmax(x, dim=-1).sum(-1, keepdim=True), x, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.bfloat16])
def test_log_softmax_row_sum_of_a_cast(dtype, looped, device, check):
    # An integer or bool cast truncates each term; the row's total of the log-softmax, computed
    # from the row's statistics, cannot stand in for it (it once did: a wrong answer).
    x = torch.randn(4, ROW, device=device) * 3
    tol = dict(atol=0.5, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=0, rtol=0)
    check(lambda x: F.log_softmax(x, dim=-1).to(dtype).sum(-1), x, **tol)


# ------------------------------------------------------------ what the kernels do


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_statistics_take_one_loop(fn, looped, device, compile_fn, observe):
    x = torch.randn(4, ROW, device=device)
    compile_fn(lambda x: fn(x, dim=-1))(x)
    (source,) = _kernels(observe).values()
    assert "_online_max" in source
    assert _loop_count(source) == 2  # the statistics, then the output


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "second_kernel"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1], ids=["plain", "label_smoothing"])
def test_cross_entropy_reads_logits_in_one_pass(smoothing, finished, looped, device, compile_fn, observe,
                                                monkeypatch):
    if not finished:  # logits past what the finishing program may gather from, as at a real vocabulary's size
        monkeypatch.setattr(smelt.scheduler.finishers, "OTHER_READ_BYTES", 0.01)
        monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")  # the constant is not part of a graph's key
    logits = torch.randn(5, ROW, device=device, dtype=torch.bfloat16)
    target = torch.randint(0, ROW, (5,), device=device)
    compile_fn(lambda x, t: F.cross_entropy(x, t, label_smoothing=smoothing))(logits, target)
    kernels = _kernels(observe)
    # The row statistics, then the loss over rows (with the gather): run by the statistics kernel's
    # last program where the logits are small enough for one program's reads (scheduler/finishers.py).
    assert len(kernels) == (1 if finished else 2)
    assert any("_finish0(" in s for s in kernels.values()) == finished
    loops = sorted(_loop_count(s) for s in kernels.values())
    assert loops == ([1] if finished else [0, 1])
    # Nothing of a row's length goes to memory: only per-row statistics and the loss.
    assert all(ROW not in shape for shape in _allocated_shapes(observe))
