"""Combo kernels' pointer tables written by a kernel (runtime/table_writer.py): a table stays where it
is and is written again exactly when the buffers moved. On the CPU the tests write CPU tables with the
interpreted writer (triton_loading.WRITE_CPU_TABLES), the logic the GPU's tables run; on CUDA the
real writer runs."""
import pytest
import torch

from conftest import inspects_triton_kernels
from smelt.runtime import table_writer, triton_loading
from smelt.runtime.table_writer import TableWriter


@pytest.fixture
def writes(monkeypatch):
    """The writes made, as (number of values, table address)."""
    monkeypatch.setattr(triton_loading, "WRITE_CPU_TABLES", True)
    made = []
    write = TableWriter.write
    monkeypatch.setattr(TableWriter, "write", lambda self, table, values: made.append(
        (len(values), table.data_ptr())) or write(self, table, values))
    return made


def _sums(ys):
    # Independent small reductions: one combo launch (codegen/triton/combo.py).
    return [y.square().sum() + i for i, y in enumerate(ys)]


def _decay(ps):
    # In place, as an optimizer's update: one combo launch whose buffers are the inputs themselves.
    for i, p in enumerate(ps):
        p.mul_(0.5).add_(i)


def test_a_table_is_written_again_only_when_the_buffers_move(device, compile_fn, assert_close, writes):
    inspects_triton_kernels()
    torch._dynamo.reset()
    compiled = compile_fn(_decay)
    ps = [torch.randn(37 + 5 * i, device=device) for i in range(6)]
    want = [p.clone() for p in ps]
    for _ in range(3):  # the same buffers: written once
        compiled(ps)
        _decay(want)
        for got, w in zip(ps, want):
            assert_close(got, w)
    assert len(writes) == 1, writes
    for _ in range(3):  # new buffers each call: written again each time, where the table was
        ps = [torch.randn_like(p) for p in ps]
        want = [p.clone() for p in ps]
        compiled(ps)
        _decay(want)
        for got, w in zip(ps, want):
            assert_close(got, w)
    assert len(writes) == 4 and len({address for _, address in writes}) == 1, writes


def test_outputs_that_move_every_call(device, compile_fn, assert_close, writes):
    """A combo writing buffers the graph allocates: each call's values are its own."""
    inspects_triton_kernels()
    torch._dynamo.reset()
    compiled = compile_fn(_sums)
    for _ in range(4):
        ys = [torch.randn(41 + 3 * i, device=device) for i in range(5)]
        for got, want in zip(compiled(ys), _sums(ys)):
            assert_close(got, want)
    assert writes


def test_a_long_table_is_written_in_pieces(device, compile_fn, assert_close, writes):
    """More values than the widest writer takes (480): written in pieces, each at its offset."""
    inspects_triton_kernels()
    torch._dynamo.reset()
    def norms(ys):  # one body: one kind, so one combo takes them all
        return [y.square().sum() for y in ys]

    ys = [torch.randn(3 + i % 7, device=device) for i in range(150)]  # 150 members, 4 values each
    compiled = compile_fn(norms)
    for _ in range(2):
        ys = [torch.randn_like(y) for y in ys]
        for got, want in zip(compiled(ys), norms(ys)):
            assert_close(got, want)
    assert writes and max(n for n, _ in writes) > table_writer.WIDTHS[-1], writes


def test_writer_widths():
    widths, length = table_writer.widths, table_writer.table_length
    assert widths(5) == [16] and length(5) == 16
    assert widths(480) == [480] and length(480) == 480
    assert widths(500) == [480, 64] and length(500) == 544
    assert widths(1000) == [480, 480, 64] and length(1000) == 1024
    assert length(0) == 0
