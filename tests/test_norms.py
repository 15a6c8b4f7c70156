"""softmax / log_softmax / layer_norm, including long rows (looped reductions)."""

import pytest
import torch
import torch.nn.functional as F

LONG_TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_family_last_dim(fn, device, check):
    x = torch.randn(33, 129, device=device) * 4
    check(lambda x: fn(x, dim=-1), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_family_middle_dim(fn, device, check):
    x = torch.randn(5, 33, 17, device=device) * 4
    check(lambda x: fn(x, dim=1), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_family_first_dim(fn, device, check):
    x = torch.randn(33, 17, device=device)
    check(lambda x: fn(x, dim=0), x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_family_long_row(fn, device, check):
    x = torch.randn(4, 5000, device=device) * 4
    check(lambda x: fn(x, dim=-1), x, **LONG_TOL)


def test_softmax_is_stable_for_large_logits(device, check):
    x = torch.randn(33, 129, device=device) * 10 + 500.0  # naive exp would overflow
    actual, _ = check(lambda x: F.softmax(x, dim=-1), x, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(actual).all()


def test_softmax_with_masked_scores(device, check):
    x = torch.randn(17, 33, device=device)
    mask = torch.rand(17, 33, device=device) > 0.3
    mask[:, 0] = True  # each row has at least one valid entry
    check(lambda x, m: F.softmax(x.masked_fill(~m, float("-inf")), dim=-1), x, mask, atol=1e-5, rtol=1e-5)


def test_softmax_of_pointwise_prologue_and_epilogue(device, check):
    x = torch.randn(33, 129, device=device)
    y = torch.randn(33, 129, device=device)
    check(lambda x, y: F.softmax(x * 0.125 + y, dim=-1) * 2 - 1, x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_layer_norm(affine, device, check):
    x = torch.randn(33, 129, device=device) * 2 + 1
    w = torch.randn(129, device=device)
    b = torch.randn(129, device=device)
    if affine:
        check(lambda x, w, b: F.layer_norm(x, (129,), w, b, eps=1e-5), x, w, b, atol=1e-5, rtol=1e-5)
    else:
        check(lambda x: F.layer_norm(x, (129,)), x, atol=1e-5, rtol=1e-5)


def test_layer_norm_weight_only(device, check):
    x = torch.randn(33, 129, device=device)
    w = torch.randn(129, device=device)
    check(lambda x, w: F.layer_norm(x, (129,), weight=w), x, w, atol=1e-5, rtol=1e-5)


def test_layer_norm_over_last_two_dims_3d(device, check):
    x = torch.randn(5, 7, 33, device=device)
    w = torch.randn(7, 33, device=device)
    b = torch.randn(7, 33, device=device)
    check(lambda x, w, b: F.layer_norm(x, (7, 33), w, b), x, w, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_layer_norm_long_row(affine, device, check):
    x = torch.randn(4, 5000, device=device) * 3 + 2
    w = torch.randn(5000, device=device) if affine else None
    b = torch.randn(5000, device=device) if affine else None
    check(lambda x, w, b: F.layer_norm(x, (5000,), w, b), x, w, b, **LONG_TOL)


def test_layer_norm_module_with_residual(device, check):
    ln = torch.nn.LayerNorm(129).to(device)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(33, 129, device=device)
    r = torch.randn(33, 129, device=device)
    with torch.no_grad():
        check(lambda x, r: ln(x + r) + r, x, r, atol=1e-5, rtol=1e-5)


def test_rms_norm_written_by_hand(device, check):
    x = torch.randn(33, 129, device=device)
    w = torch.randn(129, device=device)
    check(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("row", [5, 16, 100, 2048])
@pytest.mark.parametrize("kind", ["randn", "offset", "inf", "nan", "inf_first"])
def test_var_mean_of_rows_with_offsets_and_special_values(row, kind, device, compile_fn, assert_close):
    # Halide's contiguous rows take mean and m2 in one walk, shifted by the row's first 16 values:
    # far-off rows must keep their precision, and an inf or nan anywhere must leave var nan and
    # the mean not finite. (Eager's Welford makes the mean of a row with an inf nan or inf
    # depending on where the inf lies: only finiteness is compared there.)
    x = torch.randn(24, row, device=device)
    if kind == "offset":
        x = x * 1e-2 + 1000
    elif kind != "randn":
        special = float("nan") if kind == "nan" else float("inf")
        x[3, row // 2] = special
        x[7, 0] = special if kind == "nan" else -special
        x[11, :] = special
        if kind == "inf_first":
            x[15, :min(row, 16)] = special
    fn = lambda x: torch.var_mean(x, dim=1)  # noqa: E731
    (var, mean), (want_var, want_mean) = compile_fn(fn)(x), fn(x)
    assert_close(var, want_var, atol=1e-4, rtol=1e-4)
    assert torch.equal(mean.isfinite(), want_mean.isfinite())
    finite = want_mean.isfinite()
    assert_close(mean[finite], want_mean[finite], atol=1e-4, rtol=1e-4)


def test_batch_norm_training_keeps_eagers_precision(device, compile_fn):
    """Batch statistics and the backward's sums over N*H*W, judged against float64 by the accuracy
    rule: ATen's CPU kernels accumulate them in float64, so float32 sums lost 2-7x eager's precision
    (resnet50 and efficientnet gradients in the model suite)."""
    import torch.nn.functional as F
    from smelt.tools.accuracy import assert_accurate

    torch.manual_seed(0)
    x = torch.randn(4, 64, 32, 32, device=device) + 100  # an offset makes float32 sums lose digits
    w, b = torch.rand(64, device=device) + 0.5, torch.randn(64, device=device)
    g = torch.randn(4, 64, 32, 32, device=device)
    running = (torch.zeros(64, device=device), torch.ones(64, device=device))

    def f(x, w, b, mean, var):
        return F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1)

    def run(fn, dtype):
        args = [t.detach().to(dtype).requires_grad_(i < 3) for i, t in enumerate((x, w, b, *running))]
        y = fn(*args)
        return (y, *torch.autograd.grad(y, args[:3], g.to(dtype)), args[3], args[4])

    assert_accurate(run(compile_fn(f), torch.float32), run(f, torch.float32), run(f, torch.float64),
                    what="(y, grad x, grad w, grad b, running mean, running var)")


def test_group_norm_of_one_element_groups_keeps_float64s_precision(device, compile_fn):
    """A group of one element has variance 0 and rstd 1/sqrt(eps) = 316: written as
    x * (rstd * w) + (b - mean * rstd * w) (ATen's CPU formula, in torch's decomposition) the
    products near 1e3 cancel and keep a rounding of 6e-5 where the result is b exactly; eager
    fuses them (one rounding less), smelt did not, and a batch_norm's running mean over it came
    out 2.5x eager's error (found by the fuzzer). As (x - mean) * rstd * w + b it is b exactly."""
    import torch.nn.functional as F
    from smelt.tools.accuracy import assert_accurate

    torch.manual_seed(0)
    x = torch.randn(3, 2, 1, 1, device=device)
    w, b = torch.randn(2, device=device) * 2, torch.randn(2, device=device)
    out = compile_fn(lambda x, w, b: F.group_norm(x, 2, w, b))(x, w, b)
    assert torch.equal(out, b.view(1, 2, 1, 1).expand(3, 2, 1, 1))

    # The fuzzer's program: the batch_norm's running mean after the call.
    def f(x, w, b, mean, var, w2, b2):
        return F.batch_norm(F.group_norm(x, 2, w, b), mean, var, w2, b2, training=True, momentum=0.2)

    def run(fn, dtype):
        stats = torch.randn(2, device=device), torch.rand(2, device=device) + 0.5
        args = [t.to(dtype) for t in (x, w, b, *stats, torch.randn(2, device=device), torch.randn(2, device=device))]
        return fn(*args), args[3], args[4]

    torch.manual_seed(1)
    compiled = run(compile_fn(f), torch.float32)
    torch.manual_seed(1)
    eager = run(f, torch.float32)
    torch.manual_seed(1)
    assert_accurate(compiled, eager, run(f, torch.float64), what="(y, running mean, running var)")
    # Groups whose mean is far from 0 lose no more than eager's.
    x = torch.randn(4, 8, 3, 3, device=device) * 1e-2 + 100
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    g = lambda x, w, b: F.group_norm(x, 4, w, b)  # noqa: E731
    assert_accurate(compile_fn(g)(x, w, b), g(x, w, b), g(x.double(), w.double(), b.double()))


def test_half_float_running_stats_are_updated_in_float32(device):
    # momentum * mean + (1 - momentum) * running_mean, with a bfloat16 running mean: eager's
    # batch_norm rounds it once; the decomposition's (1 - momentum) * running_mean is a bfloat16
    # op of its own, rounded since half-float ops round as eager's do (fuzzer: 4x eager's error).
    from smelt.tools.fuzz.inputs import make_input
    from smelt.tools.fuzz.runner import check_fn

    def fn(x, w, b, rm, rv, bw, bb):
        v = torch.nn.functional.conv2d(x, w, b, groups=2)
        return (torch.nn.functional.batch_norm(v, rm, rv, bw, bb, training=True, momentum=0.2),)
    shapes = [(1, 4, 4, 4), (4, 2, 2, 1), (4,), (4,), (4,), (4,), (4,)]
    seeds = [759769593, 262894467, 889556379, 1630067935, 2035881732, 1481978204, 628361339]
    layouts = ["contiguous", "strided", "strided"] + ["contiguous"] * 4
    inputs = [make_input(s, torch.bfloat16, layout, grad=False, seed=seed, device=device,
                         **({"kind": "positive", "high": 0} if k == 4 else {}))
              for k, (s, seed, layout) in enumerate(zip(shapes, seeds, layouts))]
    assert check_fn(fn, inputs, backward=False) == []


def test_half_float_batch_norm_saves_correctly_rounded_statistics(device):
    # The saved mean and rstd the backward reads (bfloat16 on the CPU, where the running statistics
    # are): each the float64 value rounded once. Eager's CPU kernel misses in 15% of channels, where
    # a gradient near a rounding boundary then lands a step from smelt's (fuzz seeds 4330 and 1960).
    if torch.device(device).type != "cpu":
        pytest.skip("CUDA saves float32 statistics, summed in float32 as ATen's kernels sum them")
    aten = torch.ops.aten
    stats = torch.compile(lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(
        x, w, b, rm, rv, True, 0.1, 1e-5)[1:3], backend="smelt")
    gen = torch.Generator().manual_seed(0)
    for draw in range(20):
        x = (torch.randn(2, 16, 9, generator=gen) * (draw % 5 + 1) + draw % 3).to(device, torch.bfloat16)
        w, b = (torch.randn(16, generator=gen).to(device, torch.bfloat16) for _ in range(2))
        rm, rv = torch.zeros(16, device=device, dtype=torch.bfloat16), torch.ones(16, device=device, dtype=torch.bfloat16)
        mean, rstd = stats(x, w, b, rm, rv)
        var, exact_mean = torch.var_mean(x.double(), (0, 2), correction=0)
        exact_rstd = torch.rsqrt(var + 1e-5)
        assert torch.equal(mean.float(), exact_mean.to(mean.dtype).float()), draw
        assert torch.equal(rstd.float(), exact_rstd.to(rstd.dtype).float()), draw


@pytest.mark.parametrize("shape, groups, affine, dtype", [
    ((4, 1), 1, True, torch.float32),             # one element per group: the gradient is 0
    ((3, 4, 1, 1), 2, True, torch.float32),       # two elements per group
    ((2, 8, 5, 5), 4, True, torch.float32),
    ((2, 6, 7), 3, False, torch.float32),
    ((2, 8, 4, 4), 2, True, torch.bfloat16),
])
def test_group_norm_gradients_are_as_accurate_as_eagers(device, shape, groups, affine, dtype):
    # Judged against float64 (smelt/tools/accuracy.py): torch's decomposition of the backward
    # cancels terms where the gradient is small against them, and left 2e-6 where eager has 0.
    from smelt.tools.fuzz.inputs import make_input
    from smelt.tools.fuzz.runner import check_fn
    channels = shape[1]
    inputs = [make_input(shape, dtype, "contiguous", grad=True, seed=11, device=device)]
    if affine:
        inputs += [make_input((channels,), dtype, "contiguous", grad=True, seed=12 + k, device=device) for k in range(2)]
        fn = lambda x, w, b: (F.group_norm(x, groups, w, b),)  # noqa: E731
    else:
        fn = lambda x: (F.group_norm(x, groups) * 2,)  # noqa: E731
    assert check_fn(fn, inputs, backward=True) == []


def test_group_norm_gradient_over_one_element_groups(device):
    # The fuzzer's shrunk program (the addmm only changes which gradient reaches the group_norm).
    from smelt.tools.fuzz.inputs import make_input
    from smelt.tools.fuzz.runner import check_fn

    def fn(x2, x3, x4, x5, x6, x7):
        return torch.addmm(x4, x2, x3, beta=0.5), F.group_norm(x5, 1, x6, x7)
    specs = [((2, 3), True, 1563514121), ((3, 4), False, 683553784), ((1,), False, 1436507051),
             ((4, 1), True, 578734196), ((1,), False, 2116918508), ((1,), False, 1133626797)]
    inputs = [make_input(s, torch.float32, "contiguous", grad=g, seed=seed, device=device) for s, g, seed in specs]
    assert check_fn(fn, inputs, backward=True) == []


# Rows of equal values (a broadcast input, padding): eager's Welford gives a mean of exactly that value
# and a variance of exactly 0, where std's gradient is 0. A mean computed as sum / n can be an ulp
# off, and the gradient was then 0.4 (the fuzzer's std of an expanded input).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,dim", [((3, 2), 0), ((4, 3), -1), ((2, 3, 7), 1), ((3, 5000), -1)],
                         ids=["columns", "rows", "middle", "long_rows"])
def test_variance_of_equal_values_is_exactly_zero(device, compile_fn, dtype, shape, dim):
    base = torch.tensor([0.7, 0.1, 1 / 3], dtype=dtype, device=device)
    x = base[torch.arange(torch.Size(shape).numel(), device=device) % 3 * 0].reshape(shape)
    x = (x + torch.arange(shape[0], device=device, dtype=dtype).reshape(-1, *[1] * (len(shape) - 1)) * 0.3
         if dim != 0 else x)  # rows differ from each other, each row constant along dim
    fn = lambda a: (a.std(dim), torch.var_mean(a, dim, correction=0))  # noqa: E731
    a = x.clone().requires_grad_()
    std, (var, mean) = compile_fn(fn)(a)
    std.sum().backward()
    e = x.clone().requires_grad_()
    e_std, (e_var, e_mean) = fn(e)
    e_std.sum().backward()
    assert torch.equal(var, e_var) and torch.equal(std, e_std) and torch.equal(mean, e_mean)
    assert torch.equal(a.grad, e.grad), (a.grad, e.grad)
