"""torch.cat, constant padding, and tensor factories created inside the compiled fn."""
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import allocated_shapes


def test_cat_two_inputs_dim0(device, check):
    a = torch.randn(5, 33, device=device)
    b = torch.randn(12, 33, device=device)
    check(lambda a, b: torch.cat([a * 2, b + 1], dim=0), a, b)


def test_cat_two_inputs_last_dim(device, check):
    a = torch.randn(17, 5, device=device)
    b = torch.randn(17, 28, device=device)
    check(lambda a, b: torch.cat([a, b.exp()], dim=-1), a, b)


def test_cat_three_inputs_middle_dim(device, check):
    a = torch.randn(3, 4, 17, device=device)
    b = torch.randn(3, 1, 17, device=device)
    c = torch.randn(3, 9, 17, device=device)
    check(lambda a, b, c: torch.cat([a, b.sigmoid(), c * c], dim=1), a, b, c)


def test_cat_followed_by_reduction(device, check):
    a = torch.randn(17, 20, device=device)
    b = torch.randn(17, 13, device=device)
    check(lambda a, b: torch.softmax(torch.cat([a, b], dim=1), dim=1), a, b, atol=1e-5, rtol=1e-5)


def test_cat_of_noncontiguous_inputs(device, check):
    a = torch.randn(33, 17, device=device).t()
    b = torch.randn(17, 66, device=device)[:, ::2]
    check(lambda a, b: torch.cat([a, b, a - b], dim=0), a, b)


def test_cat_integer_tensors(device, check):
    a = torch.randint(-5, 5, (7, 3), device=device)
    b = torch.randint(-5, 5, (7, 4), device=device)
    check(lambda a, b: torch.cat([a, b * 2], dim=1), a, b)


@pytest.mark.parametrize(
    "pad",
    [
        pytest.param((1, 2), id="last_dim_positive"),
        pytest.param((3, 0, 0, 2), id="two_dims_positive"),
        pytest.param((-2, -3), id="last_dim_negative"),
        pytest.param((2, -1, -3, 1), id="mixed_signs"),
    ],
)
def test_constant_pad(pad, device, check):
    x = torch.randn(17, 33, device=device)
    check(lambda x: F.pad(x * 2, pad, mode="constant", value=0.5), x)


def test_constant_pad_default_zero_then_sum(device, check):
    x = torch.randn(5, 7, 33, device=device)
    check(lambda x: F.pad(x, (1, 1, 2, 0)).sum(dim=-1), x, atol=1e-5, rtol=1e-5)


def test_factories_combined_with_input(device, check):
    x = torch.randn(17, 33, device=device)

    def fn(x):
        ones = torch.ones(17, 33, device=x.device)
        zeros = torch.zeros(33, device=x.device)
        full = torch.full((17, 1), 2.5, device=x.device)
        return x * full + ones - zeros

    check(fn, x)


def test_arange_inside_compiled_fn(device, check):
    x = torch.randn(17, 33, device=device)

    def fn(x):
        r = torch.arange(33, device=x.device)  # int64
        s = torch.arange(0.0, 1.7, 0.1, device=x.device)  # float, 17 elements
        return x + r, x * s[:, None], (r % 3 == 0)

    check(fn, x)


def test_like_factories(device, check):
    x = torch.randn(17, 33, device=device)

    def fn(x):
        return torch.zeros_like(x) + x, torch.ones_like(x, dtype=torch.int32), torch.full_like(x, 7.0) - x, torch.empty_like(x).fill_(3.0)

    check(fn, x)


def test_factory_only_graph(device, check):
    x = torch.randn(3, device=device)

    def fn(x):
        return torch.arange(12, device=x.device).view(3, 4) * 2, torch.full((5,), -1, device=x.device, dtype=torch.int32), x

    check(fn, x)


def test_eye_and_triu_mask(device, check):
    x = torch.randn(17, 17, device=device)

    def fn(x):
        mask = torch.ones(17, 17, device=x.device, dtype=torch.bool).triu(1)
        return x.masked_fill(mask, 0.0) + torch.eye(17, device=x.device)

    check(fn, x)


# Past CAT_INLINE_PIECES (8) pieces, each piece is written into its slice of the cat's output.
def test_a_stack_of_many_norms_is_written_in_place(device, check, observe):
    xs = [torch.randn(n, device=device) for n in (5, 7, 300, 9, 11, 13, 2, 3, 4, 100, 64, 1)]

    def fn(*xs):
        total = torch.stack([x.pow(2).sum().sqrt() for x in xs]).pow(2).sum().sqrt()
        return total, torch.cat([x * 2 for x in xs])
    check(fn, *xs, atol=1e-5, rtol=1e-5)
    source = observe.compiled_graphs()[-1].wrapper_source
    # The 12 norms live in one buffer of 12 and the 12 doubled pieces in one of 519: no buffer
    # per piece, and the total's kernel reads one pointer, not twelve.
    assert len(allocated_shapes(source)) == 3, source
    assert "(12,), (1,)" in source and "(519,), (1,)" in source, source


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_a_cat_of_many_pieces_along_each_dim(dim, device, check):
    pieces = [torch.randn(*[(k % 3) + 1 if d == dim else 4 for d in range(3)], device=device) for k in range(11)]

    def fn(*pieces):
        out = torch.cat([p.exp() if k % 2 else p.sum(dim, keepdim=True).expand_as(p) for k, p in enumerate(pieces)], dim)
        return out, out.sum(dim)
    check(fn, *pieces, atol=1e-5, rtol=1e-5)


def test_a_cat_of_many_pieces_mixes_dtypes_and_keeps_channels_last(device, check):
    pieces = [torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last) for _ in range(10)]
    pieces[3] = pieces[3].half()
    # The half piece's product is rounded to half: an ulp there is 4e-3.
    actual, expected = check(lambda *ps: torch.cat([p * 3 for p in ps], 1), *pieces, atol=1e-2, rtol=1e-3)
    assert actual.stride() == expected.stride()


def test_a_piece_read_by_another_op_is_read_from_its_slice(device, check):
    xs = [torch.randn(6, device=device) for _ in range(9)]

    def fn(*xs):
        doubled = [x * 2 for x in xs]
        return torch.cat(doubled), doubled[4].sum() + doubled[0]
    check(fn, *xs)


def test_a_cat_of_many_empty_pieces(device, check):
    pieces = [torch.randn(0, 3, device=device) for _ in range(10)]
    check(lambda *ps: torch.cat([p * 2 for p in ps]), *pieces)


# An empty input is read only where a mask turns the lane off, and such a read must not reach
# memory: Triton printed a fixed-address load (a piece of size 0 along its dim) without its mask,
# which the interpreter died on (a fault on a GPU); Halide's bounds check refused any clamped
# address into an empty buffer.
EMPTY_PIECE_READS = {  # fn(x of 3x4, no_rows of 0x4, no_cols of 3x0)
    "cat_empty_first_into_amax": lambda x, n, c: torch.cat([c * 0.5 + 1, x[:, :1]], 1).amax(1),
    "cat_empty_last_into_sum": lambda x, n, c: torch.cat([x[:, :1], torch.exp(c)], 1).sum(1),
    "cat_empty_middle_rows": lambda x, n, c: torch.floor(torch.cat([x, n, x], 0)) + 1,
    "cat_empty_input_into_amax": lambda x, n, c: torch.cat([c, x[:, :1]], 1).amax(1),
    "cat_empty_input_rows_of_one": lambda x, n, c: torch.cat([x[:, :1], n[:, :1], x[:, 1:2]], 0) * 2,
    "pad_of_an_empty_input": lambda x, n, c: F.pad(c, (1, 2), value=3.0),
    "cat_empty_both_ends_3d": lambda x, n, c: torch.lerp(torch.cat([n[:, None], x[:, None], n[:, None]], 0),
                                                         x[:, None], 0.3),
    "pad_of_an_empty_row": lambda x, n, c: F.pad(c * 2, (1, 2), value=3.0),
    "pad_of_an_empty_row_into_sum": lambda x, n, c: F.pad(c + 1, (0, 1), value=-1.0).sum(-1),
    "softmax_of_scaled_empty_rows": lambda x, n, c: torch.softmax(c * 0.5 + 1, -1),
    # Reduced along the cat's dim: the padding lanes past the rows fall in the last piece (fuzz seed 4318).
    "cat_empty_ends_reduced_along_it": lambda x, n, c: torch.cat([n, x, n], 0).any(0),
    "cat_empty_ends_summed_along_it": lambda x, n, c: torch.cat([n, x, n], 0).sum(0),
}


@pytest.mark.parametrize("name", sorted(EMPTY_PIECE_READS))
@pytest.mark.parametrize("strides", ["contiguous", "zero", "expanded_rows"])
def test_an_empty_piece_is_never_read(name, strides, device, check):
    # Zero strides (as smelt gives an empty buffer it allocates) make every read of the piece one
    # fixed address, a load without an index to mask by; rows of stride 0 (an expanded input) a
    # load whose index does not depend on the row.
    def empty(rows, cols):
        if strides != "contiguous":
            return torch.empty_strided((rows, cols), (0, 0 if strides == "zero" else 1), device=device)
        return torch.randn(rows, cols, device=device)
    check(EMPTY_PIECE_READS[name], torch.randn(3, 4, device=device), empty(0, 4), empty(3, 0))


def test_the_gradient_of_an_empty_diagonal(device, compile_fn, assert_close):
    # The backward writes the empty diagonal's gradient into zeros (diagonal_scatter).
    x = torch.randn(1, 2, device=device, requires_grad=True)

    def fn(x):
        return torch.softmax(x, 1).diagonal(-1, 0, 1)
    out = compile_fn(fn)(x)
    (actual,) = torch.autograd.grad(out.sum() + (x * 0).sum(), x)
    (expected,) = torch.autograd.grad(fn(x).sum() + (x * 0).sum(), x)
    assert_close(actual, expected)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float16, torch.float32, torch.int64)],
                         ids=["two", "mixed_dtypes"])
def test_a_cat_whose_pieces_are_all_skipped(dtypes, device, check):
    # 1-D empty pieces are skipped (eager's legacy rule); with none left the lowering built nothing.
    pieces = [torch.zeros(0, dtype=dtype, device=device) for dtype in dtypes]
    check(lambda *p: torch.cat(p, 0), *pieces)
    check(lambda x, *p: (torch.cat(p, 0), x + 1), torch.randn(3, device=device), *pieces)


def test_cat_piece_read_at_a_gathered_scalar_index(device, check):
    # index_select of one column of a cat: each piece's test is a scalar (0-d) mask beside the
    # kernel's xmask; combined with an unrelated kernel into one launch, the interpreter's `&` of
    # the two gave an int64 mask its load refused (fuzzer, Triton CPU backend).
    def fn(x0, x1, i, u):
        return torch.index_select(torch.cat([x1, x0, x1], 1), 1, i), u // 2
    for k in range(3):
        check(fn, torch.randn(5, 1, device=device), torch.randn(5, 1, device=device),
              torch.tensor([k], device=device), torch.randint(0, 200, (1,), device=device).to(torch.uint8))


def _kernel_bodies(observe) -> list[str]:
    """The latest graph's kernel sources without comments, each kernel's name made one word."""
    (graph,) = observe.compiled_graphs()[-1:]
    sources = graph.kernel_sources.values() if isinstance(graph.kernel_sources, dict) else graph.kernel_sources
    return [re.sub(r"\w*fused\w*", "KERNEL", "\n".join(l for l in s.splitlines() if not l.lstrip().startswith("#")))
            for s in sources]


@pytest.mark.parametrize("pad", [(0, 0, 0, 0, 0, 0), (0, 0, -1, 0)], ids=["by_nothing", "cropped"])
def test_a_pad_by_nothing_or_a_crop_checks_no_bounds(pad, device, check, observe):
    # Swin pads its windows by zero rows: the pad's bound checks were int64 compares and masked loads
    # on every element of its layer norms. Its kernels are now those of the same ops without the pad.
    x = torch.randn(2, 7, 7, 8, device=device)
    crop = (slice(None), slice(None), slice(1, None)) if pad[2] else (slice(None),)
    check(lambda x: F.pad(x * 2, pad) + 1, x)
    padded = _kernel_bodies(observe)
    check(lambda x: x[crop] * 2 + 1, x)
    assert padded == _kernel_bodies(observe)
