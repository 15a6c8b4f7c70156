"""Cache hints on the loads of looped reductions (smelt/codegen/triton/eviction.py), read from the kernels."""
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import inspects_triton_kernels

pytestmark = pytest.mark.smelt_only


def _sources(observe):
    inspects_triton_kernels()
    return [src for g in observe.compiled_graphs() for src in g.kernel_sources.values()]


def _hints(source):
    return re.findall(r"tl\.load\(([a-z_0-9]+) .*?eviction_policy='(\w+)'", source)


def test_a_looped_softmax_keeps_its_row_for_the_second_pass(monkeypatch, device, check, observe):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "64")
    check(lambda x, w: F.softmax(x, dim=-1) * w, torch.randn(6, 300, device=device), torch.randn(300, device=device),
          atol=1e-5, rtol=1e-5)
    (source,) = _sources(observe)
    hints = _hints(source)
    # The row: kept for the output pass, then streamed out; the weight, read by every row: kept.
    assert ("in_ptr0", "evict_last") in hints and ("in_ptr0", "evict_first") in hints
    assert ("in_ptr1", "evict_last") in hints and ("in_ptr1", "evict_first") not in hints


def test_persistent_and_pointwise_kernels_get_no_hints(device, check, observe):
    check(lambda x: (F.softmax(x, dim=-1), x.sin() + 1), torch.randn(6, 300, device=device), atol=1e-5, rtol=1e-5)
    assert not any(_hints(s) for s in _sources(observe))


def test_hints_can_be_turned_off(monkeypatch, device, check, observe):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "64")
    monkeypatch.setenv("SMELT_EVICTION_HINTS", "0")
    check(lambda x: F.softmax(x, dim=-1), torch.randn(6, 300, device=device), atol=1e-5, rtol=1e-5)
    assert not any(_hints(s) for s in _sources(observe))


def test_a_persistent_reduction_that_writes_one_value_per_row_streams_its_rows(device, check, observe):
    check(lambda x: torch.var_mean(x, dim=-1), torch.randn(6, 300, device=device), atol=1e-5, rtol=1e-5)
    (source,) = _sources(observe)
    assert "persistent" in source
    assert _hints(source) == [("in_ptr0", "evict_first")]
