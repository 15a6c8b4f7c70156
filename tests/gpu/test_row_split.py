"""Rows too long for one program, split over programs that meet at a barrier (CUDA only: the
interpreter runs programs one after another, so interpreted kernels never split)."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _split_kernels(observe):
    return [name for g in observe.compiled_graphs() for name in g.kernel_names if "_rowsplit_" in name]


@pytest.mark.parametrize("shape", [(4, 65536), (3, 100003), (300, 131072), (1, 262144)])
def test_softmax_of_long_rows(shape, check, observe):
    x = torch.randn(shape, device="cuda") * 4
    fn = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    check(fn, x, rtol=1e-5, atol=1e-6)
    assert _split_kernels(observe), "expected a row-split kernel"


def test_split_kernel_runs_again_after_a_launch(compile_fn, assert_close):
    # The sync buffer must be zero again after every launch.
    fn = compile_fn(lambda x: F.log_softmax(x, dim=-1))
    for k in range(3):
        x = torch.randn(7, 70000, device="cuda") + k
        assert_close(fn(x), F.log_softmax(x, dim=-1), rtol=1e-5, atol=1e-5)


def test_normalize_long_rows(check):
    def fn(x):
        centered = x - x.mean(-1, keepdim=True)
        return centered / centered.abs().amax(-1, keepdim=True)
    check(fn, torch.randn(16, 50000, device="cuda"), rtol=1e-5, atol=1e-5)


def test_row_with_inf_and_nan(check):
    x = torch.randn(4, 40000, device="cuda")
    x[0, 5] = float("inf")
    x[1, 39999] = float("nan")
    x[2] = float("-inf")
    check(lambda x: torch.softmax(x, dim=-1), x, rtol=1e-5, atol=1e-6)


def test_many_long_rows_are_looped_not_split(check, observe):
    """Rows enough to fill the GPU one program each: no barriers (row_split.MAX_SPLIT_ROWS)."""
    x = torch.randn(1024, 20000, device="cuda")
    check(lambda x: torch.softmax(x, -1), x, rtol=1e-5, atol=1e-5)
    assert not _split_kernels(observe)


@pytest.mark.parametrize("rows, cols", [(4, 65536), (1024, 20000), (64, 512)])
def test_softmax_written_over_the_product_it_reads(rows, cols, compile_fn, assert_close, observe):
    """The probabilities take the dying scores' memory (scheduler/reuse.py), whether the row is
    split over programs, looped, or held whole: each element read before the program holding it writes."""
    q, k = torch.randn(rows, 32, device="cuda"), torch.randn(32, cols, device="cuda")
    fn = lambda q, k: torch.softmax(q @ k, dim=-1)  # noqa: E731
    assert_close(compile_fn(fn)(q, k), fn(q, k), rtol=1e-4, atol=1e-5)
    assert "written over" in observe.compiled_graphs()[-1].wrapper_source


@pytest.mark.parametrize("rows, cols", [(4, 65536), (1024, 20000), (64, 768)])
def test_norm_rows_and_statistics_written_over_the_sum_they_read(rows, cols, compile_fn, assert_close, observe):
    """A training norm stores its rows and, beside them, each row's mean and inverse deviation; the
    rows take the dying sum's memory however the row is walked (split, looped, whole): the
    statistics come from passes that end before the last pass writes."""
    x, w, b = torch.randn(rows, 32, device="cuda"), torch.randn(32, cols, device="cuda"), torch.randn(cols, device="cuda")

    def fn(x, w, b):
        return torch.native_layer_norm(x @ w + b, [cols], None, None, 1e-5)
    for got, expected in zip(compile_fn(fn)(x, w, b), fn(x, w, b)):
        assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert "written over" in observe.compiled_graphs()[-1].wrapper_source
