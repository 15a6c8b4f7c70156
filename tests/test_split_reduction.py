"""Split reductions: few outputs over many elements run as two kernels (partials, then their reduction).

The split threshold is lowered so that tensors small enough for the interpreter split. Sizes
that chunks do not divide exercise the masked tail of the last chunk.
"""
import dataclasses
import re

import pytest
import torch

from smelt.config import Config
from smelt.lowering.split_reduction import MIN_CHUNK, choose_split
from smelt.target import H100
from conftest import inspects_triton_kernels

# Chunks are at least MIN_CHUNK (256) long: 3000 splits into 12 chunks, the last one 184 long.
RAGGED = 3000
EVEN = 4096
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(autouse=True)
def split_small_reductions(monkeypatch):
    monkeypatch.setenv("SMELT_SPLIT_REDUCTIONS", "1")
    monkeypatch.setenv("SMELT_SPLIT_REDUCTION_MIN_NUMEL", "512")


def _kernels(observe):
    """(name, xnumel, rnumel, XBLOCK) of every stage compiled, from the kernels' header comments.
    A stage that a kernel's last program runs (a finisher) is named after its function."""
    inspects_triton_kernels()
    found = []
    for graph in observe.compiled_graphs():
        for name in graph.kernel_names:
            source = graph.kernel_sources[name]
            sizes = re.findall(r"# iterates (\w+) x (\w+);", source)
            blocks = re.findall(r"XBLOCK=(\d+)", source.split("import triton")[0])
            names = [name] + re.findall(r"last program runs (\w+):", source)
            for stage, (x, r), xblock in zip(names, sizes, blocks):
                found.append((stage, _int_or_symbol(x), _int_or_symbol(r), int(xblock)))
    return found


def _stage_source(observe, stage: str) -> str:
    """A kernel's source, or for a finisher the text of its function."""
    inspects_triton_kernels()
    for graph in observe.compiled_graphs():
        for name, source in graph.kernel_sources.items():
            if name == stage:
                return source.split(f"def {name}(")[1]
            if f"def {stage}(" in source:
                return source.split(f"def {stage}(")[1].split("@triton.jit")[0]
    raise KeyError(stage)


def _int_or_symbol(size: str):
    return int(size) if size.isdigit() else size


@pytest.mark.parametrize("n", [RAGGED, EVEN])
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_global_reduction(op, n, device, check):
    x = torch.randn(n, device=device) + 0.5
    check(lambda x: getattr(x, op)(), x, **TOL)


def test_global_prod_of_values_near_one(device, check):
    x = 1 + 0.01 * torch.randn(RAGGED, device=device)
    check(lambda x: x.prod(), x, **TOL)


@pytest.mark.parametrize("n", [RAGGED, EVEN])
def test_global_argmax_argmin_with_ties(n, device, check):
    # Few distinct values: the extreme value occurs in many chunks; eager returns its first index.
    x = torch.randint(0, 4, (n,), device=device).float()
    actual, _ = check(lambda x: (x.argmax(), x.argmin()), x)
    assert actual[0].dtype == torch.int64


def test_argmax_first_extreme_in_a_later_chunk(device, check):
    x = torch.randn(RAGGED, device=device)
    x[1000] = x[2990] = 10.0  # the first maximum is in chunk 3 of 12, another one in the tail
    x[2999] = -10.0  # the minimum is the very last element
    check(lambda x: (x.argmax(), x.argmin(), x.amax(), x.amin()), x)


def test_nan_propagates_and_argmax_finds_the_first_nan(device, check):
    x = torch.randn(RAGGED, device=device)
    x[700] = x[2900] = float("nan")
    check(lambda x: (x.amax(), x.amin(), x.sum(), x.argmax(), x.argmin()), x)


def test_argmax_over_a_matrix_gives_the_flat_index(device, check):
    x = torch.randint(0, 5, (50, 60), device=device).float()
    check(lambda x: (x.argmax(), x.argmin(keepdim=True)), x)


def test_global_any_all(device, check):
    mostly_false = torch.zeros(RAGGED, dtype=torch.bool, device=device)
    mostly_false[2995] = True  # the only True is in the masked tail's chunk
    mostly_true = torch.ones(RAGGED, dtype=torch.bool, device=device)
    mostly_true[1500] = False
    actual, _ = check(lambda a, b: (a.any(), a.all(), b.any(), b.all(), (~a).all()), mostly_false, mostly_true)
    assert actual[0].dtype == torch.bool


@pytest.mark.parametrize("n", [RAGGED, EVEN])
@pytest.mark.parametrize("correction", [0, 1])
def test_global_var_mean(correction, n, device, check):
    x = torch.randn(n, device=device) * 3 + 5  # a mean far from zero stresses the combination
    check(lambda x: (torch.var_mean(x, correction=correction), torch.var(x, correction=correction),
                     torch.std(x)), x, **TOL)


def test_looped_stages(device, check, monkeypatch, observe):
    # Rows longer than this loop over r blocks in both stages (12 chunks of 256, the last ragged).
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "8")
    x = torch.randn(RAGGED, device=device) * 3 + 5
    x[2000] = 50.0
    check(lambda x: (torch.var_mean(x, correction=1), x.sum(), x.argmax(), x.amin()), x, **TOL)
    kernels = [name for name, *_ in _kernels(observe)]
    assert kernels and all(name.startswith("triton_red_") for name in kernels), kernels


@pytest.mark.parametrize("rows", [RAGGED, EVEN])
def test_column_sum_and_var_mean_of_a_tall_matrix(rows, device, check):
    x = torch.randn(rows, 8, device=device) + 1
    check(lambda x: (x.sum(0), torch.var_mean(x, 0, correction=1), x.amax(0), x.argmin(0)), x, **TOL)


def test_row_reduction_of_a_few_long_rows(device, check):
    x = torch.randn(3, RAGGED, device=device)
    check(lambda x: (x.sum(1), torch.var_mean(x, 1), x.argmax(1)), x, **TOL)


def test_middle_dim_and_several_dims(device, check):
    x = torch.randn(4, 700, 3, device=device)
    check(lambda x: (x.sum(1), x.mean((0, 1)), torch.var_mean(x, (0, 1), correction=0)), x, **TOL)


def test_keepdim(device, check):
    x = torch.randn(RAGGED, 6, device=device)
    actual, expected = check(lambda x: (x.sum(0, keepdim=True), x.amax(keepdim=True, dim=(0, 1)),
                                        x.argmax(0, keepdim=True), torch.var_mean(x, 0, keepdim=True)), x, **TOL)
    assert [a.shape for a in actual[:3]] == [e.shape for e in expected[:3]]


def test_bf16_accumulates_in_float32(device, check):
    # Ones summed in bf16 would stop at 256; the float32 accumulator counts all 2832 (a bf16 value).
    ones = torch.ones(2832, dtype=torch.bfloat16, device=device)
    x = torch.randn(RAGGED, 8, dtype=torch.bfloat16, device=device)
    actual, _ = check(lambda a, x: (a.sum(), x.sum(0), x.mean(), torch.var_mean(x.float(), 0), x.amax()),
                      ones, x, atol=2e-2, rtol=2e-2)
    assert actual[0].dtype == torch.bfloat16 and actual[0].item() == 2832


def test_integer_sum(device, check):
    x = torch.randint(-100, 100, (RAGGED,), dtype=torch.int32, device=device)
    actual, _ = check(lambda x: (x.sum(), x.amax(), x.argmin()), x)
    assert actual[0].dtype == torch.int64


def test_producer_fuses_into_stage_one_and_consumer_into_stage_two(device, check, observe):
    x = torch.randn(RAGGED, device=device)
    check(lambda x: x.abs().mean() * 2 + 1, x, **TOL)
    kernels = _kernels(observe)
    assert len(kernels) == 2, kernels  # no kernel of its own for abs, nor for the division and the rest
    (stage1, x1, r1, _), (stage2, x2, r2, _) = kernels
    assert "abs" in stage1 and x1 * r1 >= RAGGED and r1 == MIN_CHUNK
    assert x2 == 1 and r2 == x1
    assert "tl.abs" in _stage_source(observe, stage1) and "tl.abs" not in _stage_source(observe, stage2)


def test_global_sum_runs_as_two_kernels_with_many_programs(device, check, observe):
    n = 1 << 16
    x = torch.randn(n, device=device)
    check(lambda x: x.sum(), x, **TOL)
    (_, x1, r1, xblock1), (_, x2, r2, _) = _kernels(observe)
    assert x1 * r1 == n and x1 >= 64  # chunks of the row, a program (or a few, interpreted) each
    assert -(-x1 // xblock1) >= 8
    assert (x2, r2) == (1, x1)


def test_column_sum_partials_keep_columns_contiguous(device, check, observe):
    x = torch.randn(RAGGED, 8, device=device)
    check(lambda x: x.sum(0), x, **TOL)
    (stage1, x1, r1, _), (_, x2, r2, _) = _kernels(observe)
    assert (x1, r1) == (12 * 8, MIN_CHUNK) and (x2, r2) == (8, 12)
    (graph,) = observe.compiled_graphs()
    # Partials laid out [splits, columns]: neighbouring lanes of x read neighbouring columns of a
    # chunk of rows, and r walks down the rows.
    assert "tl.load(in_ptr0 + (8*rindex + 2048*(xindex // 8) + (xindex % 8))" in graph.kernel_sources[stage1]


def test_split_can_be_switched_off(device, check, observe, monkeypatch):
    monkeypatch.setenv("SMELT_SPLIT_REDUCTIONS", "0")
    x = torch.randn(RAGGED, device=device)
    check(lambda x: x.sum(), x, **TOL)
    assert [(x, r) for _, x, r, _ in _kernels(observe)] == [(1, RAGGED)]


def test_dynamic_sizes_are_not_split(device, compile_fn, assert_close, observe):
    fn = compile_fn(lambda x: x.sum(), dynamic=True)
    for n in (RAGGED, RAGGED + 5):
        x = torch.randn(n, device=device)
        assert_close(fn(x), x.sum(), **TOL)
    kernels = _kernels(observe)
    assert kernels and all(x == 1 and isinstance(r, str) for _, x, r, _ in kernels), kernels  # one pass over s0


def test_heuristic_numbers():
    config = Config(split_reductions=True, split_reduction_min_numel=32768)
    rows, columns = (lambda: False), (lambda: True)
    # A global sum of 64M elements: 16384 chunks of 4096, each read by one program in one go.
    split = choose_split(1, 64 << 20, rows, config, H100)
    assert (split.splits, split.chunk, split.columns) == (16384, 4096, False)
    # A column sum of 32768 x 4096: 64 column blocks today, 16 chunks of 2048 rows makes 1024.
    split = choose_split(4096, 32768, columns, config, H100)
    assert (split.splits, split.chunk, split.columns) == (16, 2048, True)
    # A ragged length: power-of-two chunks, the last one shorter.
    split = choose_split(1, 50_000_017, rows, config, H100)
    assert split.chunk == 4096 and split.splits == 12208 and 0 < split.tail(50_000_017) < split.chunk
    # Enough programs already, a short row, a disabled split, a symbolic size: no split.
    assert choose_split(4096, 1 << 20, rows, config, H100) is None
    assert choose_split(1, 3_000, rows, config, H100) is None
    # A reduction to one value splits from 4096 elements (its second stage costs no launch).
    assert choose_split(1, 8192, rows, config, H100) == choose_split(
        1, 8192, rows, Config(split_reductions=True, split_reduction_min_numel=4096), H100)
    assert choose_split(2, 8192, rows, config, H100) is None
    assert choose_split(1, 64 << 20, rows, Config(split_reductions=False), H100) is None
    import sympy
    assert choose_split(sympy.Symbol("s0", positive=True, integer=True), 64 << 20, rows, config, H100) is None


def test_the_backends_target_decides_the_split(device, compile_fn, assert_close, observe, monkeypatch):
    """The lowering splits by the numbers of the Target that the device's backend reports
    (smelt/target.py): a target asking for 4 programs gets 4 chunks, not H100's 32 of 256."""
    from smelt import config
    from smelt.codegen import backends

    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")  # the patched target is not part of a cache key
    cls = type(backends.for_device(config.current(), torch.device(device)))
    original = cls.target
    monkeypatch.setattr(cls, "target", lambda self, d: dataclasses.replace(original(self, d), row_split_programs=4))
    x = torch.randn(8192, device=device)
    assert_close(compile_fn(lambda x: x.sum())(x), x.sum(), **TOL)
    sources = [s for g in observe.compiled_graphs() for s in g.kernel_sources.values()]
    assert any("# iterates 4 x 2048;" in s for s in sources), sources


def test_each_backend_reports_a_target():
    from smelt.codegen import backends
    from smelt.target import CPU

    assert backends.named("triton").target("cpu") == H100  # the interpreter runs what the GPU would
    assert backends.named("halide").target("cpu").max_storage_elements == 2 ** 31 - 1
    assert backends.named("halide").target("cpu").split_programs == CPU.split_programs
    assert backends.named("reference").target("cpu") == CPU


def test_per_column_values_under_the_chunk_mask_are_read_once_per_column(device, check, observe):
    """A batch norm before the column mean: its per-channel parameters are read in bounds whatever
    the last chunk's tail mask says, so they are loaded (and their square root taken) per column of
    the block, not per element; the activation itself keeps the mask (past the tail it is out of
    bounds)."""
    x = torch.randn(RAGGED, 8, device=device)
    mean, var, weight = (torch.rand(8, device=device) + 0.5 for _ in range(3))
    check(lambda x, mean, var, weight: ((x - mean) * torch.rsqrt(var + 1e-5) * weight).mean(0),
          x, mean, var, weight, **TOL)
    stage1 = _kernels(observe)[0][0]
    source = _stage_source(observe, stage1)
    # Only the block's own x mask (absent where XBLOCK divides the columns) may guard a per-column load.
    per_column = re.findall(r"tl\.load\(in_ptr\d \+ \(\(xindex % 8\)\)(?:, xmask, other=0\.0)?\)", source)
    assert len(per_column) == 3, source
    assert re.search(r"tl\.load\(in_ptr\d \+ \(8\*rindex.*\), (?:xmask & )?tmp\d+, other=0\.0\)", source), source
