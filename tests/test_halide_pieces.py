"""Halide kernels printed a loop per piece of their domain (codegen/halide/pieces.py): a cat or a pad
read inside a kernel, whose masked loads were gathers throughout."""
import os

import pytest
import sympy
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.smelt_only, pytest.mark.cpu_backend_independent]

if os.environ.get("SMELT_TEST_DEVICE", "cpu") != "cpu":
    pytest.skip("the Halide backend runs CPU tensors", allow_module_level=True)

import smelt.observe  # noqa: E402
from smelt.codegen.halide.pieces import Piece, boundaries, decide, split  # noqa: E402
from smelt.scheduler.nodes import RINDEX, XINDEX  # noqa: E402
from smelt.symbolic import FloorDiv, ModularIndexing, index_bounds, simplify_index  # noqa: E402
from test_halide import halide_backend, refuse_sources_holding  # noqa: E402,F401  (autouse: Halide, no fallback)

x, r = XINDEX, RINDEX


def kernel_sources() -> list[str]:
    (graph,) = smelt.observe.compiled_graphs()[-1:]
    return list(graph.kernel_sources.values())


def run(fn, *args, pieces: bool):
    """fn compiled against eager; `pieces`: whether a kernel is printed in pieces, and then
    none of the kernels loads under a mask."""
    actual = torch.compile(fn, backend="smelt", fullgraph=True)(*args)
    torch.testing.assert_close(actual, fn(*args))
    sources = kernel_sources()
    split_kernels = [s for s in sources if "piece_dom0 = " in s]
    assert bool(split_kernels) == pieces, sources
    for source in split_kernels:
        body = source[source.index("def halide_"):]
        assert "load_clamped(" not in body, body


# ---------------------------------------------------------------- the arithmetic


def test_a_piece_walks_its_runs_and_its_coordinate_reads_back():
    # x in [0, 4 * 8 * 16): coordinate (x // 16) % 8, the piece [3, 5) of it: 4 rows of runs of 32.
    piece = Piece(0, 3, 5, 16, 8, 4)
    assert (piece.run, piece.rows) == (32, 4)
    flat = piece.substitution()[x]
    walked = [int(flat.subs({r: i, x: row}, simultaneous=True)) for row in range(4) for i in range(32)]
    assert walked == [b * 128 + c * 16 + i for b in range(4) for c in (3, 4) for i in range(16)]
    coordinate = simplify_index(ModularIndexing(flat, 16, 8), piece.ranges())
    assert index_bounds(coordinate, piece.ranges()) == (3, 4)


def test_a_piece_of_r_walks_each_x_in_turn():
    # (r, x) over r in [0, 3 * 10), x in [0, 2): coordinate r % 10, the piece [6, 10): rows (x, block).
    piece = Piece(1, 6, 10, 1, 10, 3, r, xnumel=2, rnumel=30)
    assert (piece.inner, piece.rows) == (4, 6)
    change = piece.substitution()
    walked = [(int(change[x].subs(x, row)), int(change[r].subs({r: i, x: row}, simultaneous=True)))
              for row in range(6) for i in range(4)]
    assert walked == [(xx, b * 10 + c) for xx in range(2) for b in range(3) for c in range(6, 10)]


@pytest.mark.parametrize("op, low, high, expected", [
    ("lt", -5, -1, True), ("lt", 0, 3, False), ("lt", -1, 0, None),
    ("le", -3, 0, True), ("le", 1, 2, False), ("gt", 1, 9, True), ("gt", -2, 0, False),
    ("ge", 0, 0, True), ("ge", -2, -1, False), ("eq", 0, 0, True), ("eq", 1, 4, False),
    ("eq", -1, 1, None), ("ne", 2, 3, True), ("ne", 0, 0, False)])
def test_decide(op, low, high, expected):
    assert decide(op, low, high) is expected


def test_boundaries_of_each_comparison():
    c = ModularIndexing(x, 4, 10)
    assert boundaries("lt", c - 3, 80) == ((4, 10), {3})
    assert boundaries("ge", c - 3, 80) == ((4, 10), {3})
    assert boundaries("le", c - 3, 80) == ((4, 10), {4})
    assert boundaries("gt", 3 - c, 80) == ((4, 10), {3})  # 3 > c: c < 3
    assert boundaries("lt", 3 - c, 80) == ((4, 10), {4})  # 3 < c: c >= 4
    assert boundaries("eq", c - 3, 80) == ((4, 10), {3, 4})
    assert boundaries("lt", x - 7, 80) == ((1, 80), {7})
    assert boundaries("lt", FloorDiv(x, 8) - 7, 80) == ((8, 10), {7})
    assert boundaries("lt", 2 * c - 3, 80) is None


def test_split_needs_one_coordinate_and_a_cut_inside_it():
    c = ModularIndexing(x, 4, 10)
    pieces = split([("lt", c - 3), ("ge", c - 7)], 80)
    assert split([("lt", ModularIndexing(r, 4, 10) - 3)], 5, 80)[0].var == r  # r of a kernel over (r, x)
    assert split([("lt", c - 3)], 80, 7)[0].var == x
    assert [(p.low, p.high, p.outer) for p in pieces] == [(0, 3, 2), (3, 7, 2), (7, 10, 2)]
    assert split([("lt", c - 3), ("lt", FloorDiv(x, 40) - 1)], 80) is None  # two coordinates
    assert split([("lt", c - 10)], 80) is None  # cuts nothing
    assert split([("lt", c - 3)], 90) is None  # not whole blocks
    many = [("lt", c - k) for k in range(1, 10)]
    assert split(many, 80) is None  # past MAX_PIECES


# ---------------------------------------------------------------- kernels against eager


def test_a_1d_cat_of_two_rolled_pieces():
    # The long rows' sibling: 1M float32 ran 770 us on gathers (Inductor 420); in pieces 250.
    x = torch.randn(1 << 16)
    run(lambda x: torch.cat([-x[32:], x[:32]]) * 2 + 1, x, pieces=True)


def test_a_kv_cache_cat_along_the_sequence():
    past, new = torch.randn(2, 3, 37, 16), torch.randn(2, 3, 1, 16)
    run(lambda p, n: torch.cat([p, n], dim=-2), past, new, pieces=True)


def test_a_cat_of_three_pieces_along_a_middle_dim_read_by_a_pointwise_op():
    a, b, c = torch.randn(3, 5, 7), torch.randn(3, 2, 7), torch.randn(3, 4, 7)
    run(lambda a, b, c: torch.cat([a, b.exp(), c * 3], dim=1).sin() + 1, a, b, c, pieces=True)


def test_a_rotate_half_with_runs_shorter_than_a_vector():
    q = torch.randn(2, 4, 6, 10)

    def rotate_half(q):
        return torch.cat((-q[..., 5:], q[..., :5]), dim=-1) * 0.5 + q
    run(rotate_half, q, pieces=True)


def test_a_cat_of_mixed_dtypes_and_a_piece_of_one_element():
    a, b = torch.randint(-9, 9, (4, 31), dtype=torch.int32), torch.randn(4, 1, dtype=torch.bfloat16)
    run(lambda a, b: torch.cat([a, b], dim=1) * 3, a, b, pieces=True)


def test_a_cat_stored_beside_its_reader():
    a, b = torch.randn(8, 40), torch.randn(8, 24)

    def f(a, b):
        c = torch.cat([a, b], dim=1)
        return c, c.relu() * 2
    run(f, a, b, pieces=True)


def test_a_rotary_embedding_over_rows_of_heads():
    # Llama's: q read through a transpose (a kernel over (r, x)), rotate_half's cat along each head's dim.
    x, cos, sin = torch.randn(2, 24, 3 * 16), torch.randn(24, 16), torch.randn(24, 16)

    def rope(x, cos, sin):
        q = x.view(2, 24, 3, 16).transpose(1, 2)
        return q * cos + torch.cat((-q[..., 8:], q[..., :8]), -1) * sin
    run(rope, x, cos, sin, pieces=True)


def test_a_cat_along_rows_of_a_kernel_over_r_and_x():
    # The second piece is read with a stride, so the kernel walks (r, x); its cut is on x.
    x, cos = torch.randn(4, 128, 256), torch.randn(128, 64)
    run(lambda x, c: torch.cat([x.view(1, 8, 64, 256), c.view(1, 8, 1, 1024)[..., :256]], dim=-2), x, cos,
        pieces=True)


@pytest.mark.parametrize("count, pieces", [(3, False), (4, True), (8, True)])
def test_a_cat_of_channels_last_pieces_back_to_nchw(count, pieces):
    # A dense block's cat: its store transposes in tiles, each tile evaluating every masked load. From
    # MIN_GATHERS_OVER_TILES inputs the kernel goes to pieces (8 pieces in tiles: a 68 s first call, cpu_pieces).
    parts = [torch.randn(2, 16 if k == 0 else 8, 12, 12).to(memory_format=torch.channels_last) for k in range(count)]

    def block(*parts):
        return torch.cat([p.relu() if k % 2 else p for k, p in enumerate(parts)], 1).contiguous() * 2
    run(block, *parts, pieces=pieces)
    tiled = [s for s in kernel_sources() if "_tiles = hl.RDom" in s]
    assert bool(tiled) != pieces, kernel_sources()


def test_a_cat_into_a_channels_last_tensor_of_few_channels_keeps_its_row_chunks():
    # The store interleaves rows (schedule.RowChunks): in chunks it ran faster than in pieces
    # (RESULTS, fifty-eighth session), so only tiles that transpose give way to pieces.
    parts = [torch.randn(8, 1, 16, 16) for _ in range(4)]

    def f(a, b, c, d):
        return torch.cat([a, b.relu(), c * 2, d], 1).contiguous(memory_format=torch.channels_last) + 1
    run(f, *parts, pieces=False)


def test_a_pad_on_both_sides_of_the_last_dim():
    x = torch.randn(3, 4, 50)
    run(lambda x: F.pad(x.exp(), (3, 5), value=-1.0) + 2, x, pieces=True)


def test_a_pad_of_two_dims_keeps_one_loop():
    # Its comparisons read two coordinates (rows and columns): no split, still exact.
    x = torch.randn(3, 9, 10)
    run(lambda x: F.pad(x, (1, 2, 3, 4)) * 2, x, pieces=False)


def test_a_cat_under_dynamic_shapes_keeps_one_loop():
    f = torch.compile(lambda a, b: torch.cat([a, b + 1]) * 2, backend="smelt", dynamic=True)
    for n in (40, 57):
        a, b = torch.randn(n), torch.randn(n + 3)
        torch.testing.assert_close(f(a, b), torch.cat([a, b + 1]) * 2, rtol=0, atol=0)
        assert not any("piece_dom0 = " in s for s in kernel_sources())


def test_a_kernel_in_pieces_halide_refuses_is_generated_again_in_one_loop(caplog, monkeypatch):
    # A later Halide that refused a pipeline of several updates would send the kernel to Triton's
    # interpreter: refused once, it is generated again in one loop and runs in Halide.
    refused = refuse_sources_holding("piece_dom0 = ", monkeypatch)
    a, b = torch.randn(5, 40), torch.randn(5, 9)
    with caplog.at_level("DEBUG", logger="smelt"):
        run(lambda a, b: torch.cat([a, b], dim=1) * 2, a, b, pieces=False)
    assert refused and "generated again in its plain form" in caplog.text
