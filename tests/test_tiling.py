"""Pointwise kernels that read along one dim and write along another run as 2-D tiles."""

import itertools

import pytest
import sympy
import torch

import smelt.artifact
from conftest import inspects_triton_kernels


def _sources(observe) -> list[str]:
    inspects_triton_kernels()
    return [src for g in observe.compiled_graphs() for src in g.kernel_sources.values()]


def _tiled(observe) -> list[str]:
    return [src for src in _sources(observe) if "# tiled:" in src]


def _assert_one_tiled_kernel(observe) -> str:
    sources = _sources(observe)
    assert len(sources) == 1, sources
    (src,) = sources
    assert "# tiled:" in src, src
    assert "tl.program_id(1)" in src and "xindex" in src and "rindex" in src, src
    assert "for roffset" not in src, src  # r is split across programs, never looped over
    return src


def test_transpose_plus_add(device, check, observe):
    x = torch.randn(33, 65, device=device)
    y = torch.randn(65, 33, device=device)
    check(lambda x, y: x.t() + y, x, y)
    src = _assert_one_tiled_kernel(observe)
    # x is read (and the output, which keeps x.t()'s strides, written) down the tile's columns.
    assert "contiguous along x: arg0_1, buf0; along r: arg1_1" in src, src
    # Two of the three accesses run along x: consecutive programs walk x tiles.
    assert "xoffset = tl.program_id(0)" in src and "roffset = tl.program_id(1)" in src, src


def test_the_grid_walks_r_first_when_as_many_accesses_run_along_r(device, check, observe):
    check(lambda x, y: x + y.t(), torch.randn(33, 65, device=device), torch.randn(65, 33, device=device))
    src = _assert_one_tiled_kernel(observe)
    assert "roffset = tl.program_id(0)" in src and "xoffset = tl.program_id(1)" in src, src


def test_permute_3d_keeps_batch_in_the_outer_factor(device, check, observe):
    x = torch.randn(5, 70, 30, device=device)
    actual, _ = check(lambda x: x.permute(0, 2, 1).contiguous(), x)
    assert actual.is_contiguous()
    src = _assert_one_tiled_kernel(observe)
    assert "# tiled: 150 (x) x 70 (r)" in src, src  # x walks (batch, 30), r walks 70


def test_sizes_not_divisible_by_the_tile_are_masked(device, check, observe):
    x = torch.randn(67, 130, device=device)
    check(lambda x: x.t().contiguous() * 3, x)
    src = _assert_one_tiled_kernel(observe)
    assert "xmask & rmask" in src, src


def test_divisible_sizes_need_no_mask(device, check, observe):
    x = torch.randn(64, 128, device=device)
    check(lambda x: x.t().contiguous() * 3, x)
    src = _assert_one_tiled_kernel(observe)
    assert "mask" not in src.split("tl.constexpr):")[1], src


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_transpose_other_dtypes(device, check, observe, dtype):
    x = torch.randn(40, 24, device=device).mul(10).to(dtype)
    y = torch.randn(24, 40, device=device).mul(10).to(dtype)
    if dtype == torch.bool:
        check(lambda x, y: x.t() | y, x, y)
    else:
        check(lambda x, y: x.t() + y, x, y)
    _assert_one_tiled_kernel(observe)


def test_fused_chain_tiles_as_one_kernel(device, check, observe):
    x = torch.randn(48, 36, device=device)
    y = torch.randn(36, 48, device=device)
    bias = torch.randn(36, 1, device=device)

    def fn(x, y, bias):
        a = x.t() + y
        return a, torch.relu(a * 2 + bias).sigmoid()

    check(fn, x, y, bias)
    src = _assert_one_tiled_kernel(observe)
    assert src.count("tl.store(") == 2, src


@pytest.mark.parametrize("channels", [3, 16])
def test_channels_last_copy(device, check, observe, channels):
    x = torch.randn(2, channels, 5, 7, device=device)
    actual, _ = check(lambda x: x.contiguous(memory_format=torch.channels_last) + 1, x)
    assert actual.is_contiguous(memory_format=torch.channels_last)
    _assert_one_tiled_kernel(observe)


def test_channels_last_input_to_contiguous(device, check, observe):
    x = torch.randn(2, 16, 5, 7, device=device).contiguous(memory_format=torch.channels_last)
    actual, _ = check(lambda x: torch.sin(x).contiguous(), x)
    assert actual.is_contiguous()
    _assert_one_tiled_kernel(observe)


def test_flat_output_of_a_transposed_read(device, check, observe):
    # The output iterates one flat range; the split comes from how the read divides the index.
    x = torch.randn(40, 24, device=device)
    check(lambda x: (x.t() + 1).reshape(-1), x)
    src = _assert_one_tiled_kernel(observe)
    assert "# tiled: 24 (x) x 40 (r)" in src, src


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_member_walking_memory_order_is_not_split_where_it_reads_a_value_elsewhere(device, check, dtype):
    """v's float32 copy and its transpose's copy (strides (40, 1, 8), walked in memory order) fuse
    with a [1, 8, 5] kernel: the 1-D walk reads each copied value where it was made, a split of the
    flat range by the transpose's own dims would not. Found as wrong attention gradients (bf16 SDPA of
    3-D inputs under CPU autocast, Halide: the saved v^T read transposed)."""
    def copies(k, v):
        a = k.transpose(1, 2).contiguous().transpose(1, 2).float().transpose(1, 2) * 0.5
        c = v.float()
        return a, a.transpose(1, 2).to(dtype), c, c.transpose(1, 2).to(dtype)
    k, v = (torch.randn(1, 5, 8, device=device, dtype=dtype) for _ in range(2))
    check(copies, k, v)


_PERMS = list(itertools.permutations(range(3)))


@pytest.mark.parametrize("read", _PERMS, ids=str)
@pytest.mark.parametrize("walk", _PERMS, ids=str)
def test_copies_of_permuted_views_fused_with_their_sources(device, check, read, walk):
    """The class of the test above, under every pair of 3-D permutes: k read across its memory
    order (so that tiles pay), its scaled copy and that copy's permuted cast, v's copy and its
    permuted cast (walked in memory order). Before the fix 14 of 120 random such cases were off."""
    undo = [walk.index(i) for i in range(3)]

    def copies(k, v):
        a = k.permute(read).contiguous().permute([read.index(i) for i in range(3)]).float().permute(walk) * 0.5
        c = v.float()
        return a, a.permute(undo).to(torch.bfloat16), c, c.permute(walk).to(torch.bfloat16)
    k, v = (torch.randn(3, 4, 5, device=device, dtype=torch.bfloat16) for _ in range(2))
    check(copies, k, v)


def test_in_place_add_of_a_transpose(device, check, observe):
    x = torch.randn(24, 24, device=device)
    y = torch.randn(24, 24, device=device)

    def fn(x, y):
        x.add_(y.t())
        return x

    check(fn, x, y, clone_inputs=True)
    assert _tiled(observe)


def test_dynamic_sizes(device, compile_fn, observe, assert_close):
    fn = compile_fn(lambda x, y: x.t() * y, dynamic=True)
    for m, n in ((20, 33), (7, 50), (64, 64)):
        x = torch.randn(m, n, device=device)
        y = torch.randn(n, m, device=device)
        assert_close(fn(x, y), x.t() * y)
    (src,) = _sources(observe)
    assert "# tiled:" in src and "xmask & rmask" in src, src


def test_many_programs_fold_onto_the_third_grid_axis(device, check, observe, monkeypatch):
    monkeypatch.setattr(smelt.artifact, "GRID_AXIS_LIMIT", 2)
    x = torch.randn(300, 520, device=device)
    check(lambda x: (x.t() + 1).contiguous(), x)  # eager lays x.t() + 1 out transposed: no tiles
    src = _assert_one_tiled_kernel(observe)
    assert "tl.program_id(2)" in src, src


def test_contiguous_pointwise_stays_1d(device, check, observe):
    x = torch.randn(33, 65, device=device)
    y = torch.randn(33, 65, device=device)
    check(lambda x, y: x + y * 2, x, y)
    (src,) = _sources(observe)
    assert "# tiled:" not in src and "tl.program_id(1)" not in src and "RBLOCK: tl.constexpr" not in src, src


def test_broadcast_row_plus_column_stays_1d(device, check, observe):
    # Every access is contiguous or a broadcast along the flat index: nothing to gain from tiles.
    a = torch.randn(17, 1, device=device)
    b = torch.randn(1, 33, device=device)
    check(lambda a, b: a + b, a, b)
    assert not _tiled(observe)


def test_contiguous_read_through_reshapes_stays_1d(device, check, observe):
    # An MLP's activation reads a matmul's [b*t, 4d] output through a [b, t, 4d] view: the index
    # splits into digits that must merge back into the flat index, or the kernel tiles for nothing.
    x = torch.randn(6, 10, 16, device=device)
    up = torch.randn(16, 96, device=device)
    down = torch.randn(96, 16, device=device)

    def mlp(x, up, down):
        h = torch.nn.functional.gelu((x.reshape(60, 16) @ up).view(6, 10, 96), approximate="tanh")
        return h.view(60, 96) @ down
    check(mlp, x, up, down)
    (src,) = _sources(observe)
    assert "# tiled:" not in src and "tl.program_id(1)" not in src, src
    assert "in_ptr0 + (xindex)" in src, src


def test_how_far_an_index_moves_a_step():
    """A run of lanes reads memory in order where the index moves 0..1 a step; a floor division
    alone that jumps every few lanes is a gather, not a broadcast."""
    from smelt.scheduler.nodes import RINDEX as r, XINDEX as x
    from smelt.scheduler.tiling import _is_cheap, stride_along
    from smelt.symbolic import FloorDiv, ModularIndexing
    # A stride-2 window's gather over NHWC rows of 144 channels: runs of two lanes, then 144 on.
    assert stride_along(144 * FloorDiv(r, 2) + 7, r) is None
    assert not _is_cheap(144 * FloorDiv(r, 2), (r,))
    # A batch of transposed [30, 70] planes walked in memory order: runs of 30, each contiguous.
    assert stride_along(2100 * FloorDiv(x, 30) + ModularIndexing(x, 1, 30), x) == 1
    # NCHW's channel index: one value for 70 lanes at a time, nearly a broadcast.
    assert stride_along(ModularIndexing(x, 70, 30), x) == sympy.Rational(1, 70)
    assert _is_cheap(ModularIndexing(x, 70, 30), (x,))
    # ... at sizes known only at run time, and flipped.
    s1, s2 = sympy.symbols("s1 s2", positive=True, integer=True)
    assert _is_cheap(ModularIndexing(x, s1 * s2, 30), (x,))
    assert _is_cheap(29 - ModularIndexing(x, 70, 30), (x,))
    # Nearest upsampling's source: each element read for two lanes.
    assert stride_along(FloorDiv(r, 2), r) == sympy.Rational(1, 2)
    # Rows of three channels interleaved: runs of 3 the tile's other axis fills; a table of three read in turn.
    assert stride_along(768 * FloorDiv(x, 3) + ModularIndexing(x, 1, 3), x) == 1
    assert _is_cheap(ModularIndexing(x, 1, 3), (x,))
    # Frames of 400 samples every 160 (`unfold`): runs of 400, each contiguous.
    assert stride_along(160 * ModularIndexing(x, 400, 98) + ModularIndexing(x, 1, 400), x) == 1
