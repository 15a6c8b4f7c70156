"""Pooling, padding modes and data movement lowered to index math, compared with eager."""
import copy

import pytest
import torch
import torch.nn.functional as F

from smelt.tools.saved import saved_for_backward

NAN, INF = float("nan"), float("inf")


def _no_fallback(observe):
    assert not any(g.fallback_ops for g in observe.compiled_graphs()), \
        [g.fallback_ops for g in observe.compiled_graphs()]


def _tricky(*shape):
    """Random values with ties, NaNs and all -inf planes: what max-pool indices must get right."""
    x = torch.randn(*shape)
    x[0, 0] = -INF
    x[0, 1, :3] = 2.0
    x[1, 0, 2, 3] = NAN
    x[1, 0, 3, 4] = NAN
    return x


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1)),
    dict(kernel_size=2),
    dict(kernel_size=(6, 5), stride=(2, 3), padding=(3, 2), dilation=(1, 2), ceil_mode=True),  # reduction path
])
def test_max_pool2d_values_and_indices(check, observe, kwargs):
    x = _tricky(2, 3, 9, 11)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kwargs), x)
    _no_fallback(observe)


def test_max_pool2d_channels_last(check, observe):
    x = _tricky(2, 4, 7, 8).contiguous(memory_format=torch.channels_last)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x)
    _no_fallback(observe)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=2, padding=1, divisor_override=5),
    dict(kernel_size=(7, 6), stride=1, padding=2),  # a Reduction over the window
])
def test_avg_pool2d(check, observe, kwargs):
    x = torch.randn(2, 3, 9, 11)
    check(lambda x: F.avg_pool2d(x, **kwargs), x)
    _no_fallback(observe)


@pytest.mark.parametrize("size", [(4, 5), (1, 1), (3, 11), (9, 2)])
def test_adaptive_pools(check, observe, size):
    x = _tricky(2, 3, 9, 11)
    check(lambda x: (F.adaptive_avg_pool2d(x, size), F.adaptive_max_pool2d(x, size, return_indices=True)), x)
    _no_fallback(observe)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_pool_over_a_value_realized_after_it_runs_after_that_value(check, training):
    """The pool's window reads its input's buffer when its body is traced, and the stack it pools
    became a buffer only after the pool did (as a returned or saved value): the pool's kernel ran
    first, reading a buffer not yet written (a crash, or garbage where the buffer existed). The
    scheduler now orders steps by what they read (fuzzer, seed 2603 program 61)."""
    a = torch.randn(8, 2, 1, requires_grad=training)
    b = torch.randn(8, 2, 1)

    def fn(a, b):
        stacked = torch.stack([a, b], 0)
        return F.adaptive_max_pool2d(stacked, (2, 1)), stacked
    check(fn, a, b)


def test_pools_3d(check, observe):
    x = _tricky(2, 3, 5, 6, 7)
    check(lambda x: (F.max_pool3d(x, 3, 1, 1, return_indices=True), F.max_pool3d(x, 2, ceil_mode=True),
                     F.avg_pool3d(x, (2, 3, 2), 2, 1, ceil_mode=True, count_include_pad=False),
                     F.adaptive_avg_pool3d(x, (2, 4, 3))), x)
    _no_fallback(observe)


@pytest.mark.parametrize("pool", [
    torch.nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(2), torch.nn.MaxPool2d((2, 3), (1, 2), 1, dilation=(2, 1)),
    torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True), torch.nn.MaxPool2d((3, 2), (2, 3), (1, 0), dilation=(1, 2), ceil_mode=True),
    torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), torch.nn.AvgPool2d((4, 2), (1, 3), (2, 1)),
    torch.nn.AvgPool2d(3, 2, divisor_override=4), torch.nn.MaxPool3d(2, 1, 1), torch.nn.AvgPool3d(3, 2, 1),
])
def test_training_step_through_pool(compile_fn, assert_close, observe, pool):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3) if "2d" in type(pool).__name__ else torch.nn.Conv3d(3, 4, 3)
    shape = (2, 3, 11, 12) if "2d" in type(pool).__name__ else (2, 3, 7, 8, 9)
    x = torch.randn(*shape)

    def loss_of(y):
        return (y * torch.arange(y.numel()).reshape(y.shape).sin()).sum()

    eager, compiled = conv, copy.deepcopy(conv)
    expected = loss_of(pool(eager(x)))
    expected.backward()
    actual = loss_of(compile_fn(lambda x: pool(compiled(x)))(x))
    actual.backward()
    assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    assert_close(compiled.weight.grad, eager.weight.grad, atol=1e-4, rtol=1e-4)
    assert not any(op.startswith(("aten.max_pool", "aten.avg_pool")) for g in observe.compiled_graphs()
                   for op in g.fallback_ops)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_modes(check, observe, mode):
    x = torch.randn(2, 3, 5, 6, 7)
    check(lambda x: (F.pad(x[0, 0, 0], (2, 3), mode=mode), F.pad(x[0], (2, 3, 1, 4), mode=mode),
                     F.pad(x, (2, 3, 1, 4, 3, 1), mode=mode), F.pad(x[0], (-1, 3, 1, -2), mode=mode)), x)
    _no_fallback(observe)


def test_circular_pad(check):
    x = torch.randn(2, 3, 5, 6)
    check(lambda x: F.pad(x, (2, 3, 1, 4), mode="circular"), x)


def test_flip_roll_repeat(check, observe):
    x = torch.randn(4, 5, 6)
    check(lambda x: (x.flip(0, 2), x.roll(2, 1), x.roll((2, -7), (0, 2)), x.roll(5), x.repeat(2, 1, 3, 2),
                     torch.fliplr(x), torch.flipud(x) + 1), x)
    _no_fallback(observe)


def test_views_unfold_diagonal(check, observe):
    x = torch.randn(4, 5, 6)
    check(lambda x: (x.unfold(1, 2, 2) + 1, x.unfold(2, 3, 1), x.diagonal(1, 0, 2) * 2, x.diagonal(-2, 2, 1),
                     torch.narrow_copy(x, 1, -3, 2), torch.as_strided_copy(x, (3, 3), (2, 5), 4)), x)
    _no_fallback(observe)


def test_rounding_and_nan_aware_math(check, observe):
    x = torch.randn(4, 5, 6) * 100
    a, b = x.clone(), torch.randn(4, 5, 6)
    a[0, 0] = NAN
    b[0, :, 0] = NAN
    check(lambda x: (torch.round(x), torch.round(x, decimals=2), torch.round(x, decimals=-1)), x, atol=0, rtol=0)
    check(lambda a, b: (torch.fmax(a, b), torch.fmin(a, b), torch.angle(a), torch.ldexp(b, (a % 7).int())), a, b)
    check(lambda i: torch.angle(i), torch.randint(-3, 3, (5,)))
    _no_fallback(observe)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nextafter(check, observe, dtype):
    x = torch.tensor([0.0, 1, -1, 1, INF, 3, -0.0, NAN, 1e-30], dtype=dtype)
    y = torch.tensor([1.0, 2, -2, 0, 0, 3, -1, 1, -INF], dtype=dtype)
    check(lambda x, y: (torch.nextafter(x, y), torch.nextafter(x, y[1])), x, y, atol=0, rtol=0)
    _no_fallback(observe)


def _saved_by_compiled_functions(loss) -> list:
    """(shape, dtype) of each tensor the compiled graphs behind `loss` saved for their backward."""
    return [(tuple(t.shape), t.dtype) for t in saved_for_backward(loss)]


@pytest.mark.parametrize("window", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=7, stride=1, padding=3)])
def test_a_max_pools_input_is_not_saved_for_its_backward(device, compile_fn, assert_close, window):
    """The pool's backward reads its indices, not its input's values, so the input (a ReLU of a
    batch norm) is recomputed from the convolution's output, as Inductor does, not saved beside it;
    the indices are saved as int8 places in their windows.
    The 7x7 window at stride 1 has too many candidate windows per element to unroll: ATen's backward
    runs, on the zero standing in for the input."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(**window)).to(device)
    ours = copy.deepcopy(net)
    # Small: the 7x7 window's 49-way argmax runs its combine element by element under Triton's
    # interpreter (a 2 x 3 x 12 x 12 input took 66 s there).
    x = torch.randn(1, 3, 8, 8, device=device)
    w = torch.randn(8, 1, 1, device=device)  # a weighted sum: its backward needs no output
    (net(x) * w).sum().backward()
    torch._dynamo.reset()
    loss = compile_fn(lambda x: (ours(x) * w).sum())(x)
    saved = _saved_by_compiled_functions(loss)
    loss.backward()
    for p, q in zip(net.parameters(), ours.parameters()):
        assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-4)
    assert saved.count(((1, 8, 8, 8), torch.float32)) == 1, saved  # the convolution's output only
    # The pool's choice saved as each index's place in its window, in int8, not as int64 indices.
    pooled = tuple(ours(x).shape)
    assert (pooled, torch.int8) in saved and (pooled, torch.int64) not in saved, saved


@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1))])
def test_max_pool_gradient_through_ties_nans_and_empty_planes(device, compile_fn, assert_close, kwargs):
    """The backward rebuilds each index from its place in its window (saved as int8): ties, NaNs and
    all -inf planes, whose indices are the first place of the window, route the gradient as eager's."""
    x = _tricky(2, 3, 9, 10).to(device)
    w = torch.randn(F.max_pool2d(x, **kwargs).shape, device=device)
    expected, actual = x.clone().requires_grad_(), x.clone().requires_grad_()
    (F.max_pool2d(expected, **kwargs) * w).sum().backward()
    torch._dynamo.reset()
    compile_fn(lambda x: (F.max_pool2d(x, **kwargs) * w).sum())(actual).backward()
    assert_close(actual.grad, expected.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pool", [torch.nn.AvgPool2d(3, 2, 1), torch.nn.AvgPool3d(2, 2)])
def test_an_average_pools_input_is_not_saved_for_its_backward(device, compile_fn, assert_close, pool):
    """The sibling: an average pool's backward needs its input's shape only, so a convolution's
    output that feeds only the pool is not saved (the convolution's backward reads its input)."""
    torch.manual_seed(0)
    conv = (torch.nn.Conv2d(3, 8, 3, padding=1) if "2d" in type(pool).__name__ else
            torch.nn.Conv3d(3, 8, 3, padding=1)).to(device)
    x = torch.randn(2, 3, *(12,) * (2 if "2d" in type(pool).__name__ else 3), device=device)
    ours = copy.deepcopy(conv)
    w = torch.randn(8, *(1,) * (x.dim() - 2), device=device)
    (pool(conv(x)) * w).sum().backward()
    torch._dynamo.reset()
    loss = compile_fn(lambda x: (pool(ours(x)) * w).sum())(x)
    saved = _saved_by_compiled_functions(loss)
    loss.backward()
    for p, q in zip(conv.parameters(), ours.parameters()):
        assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-4)
    assert (tuple(conv(x).shape), torch.float32) not in saved, saved


@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("shape,dynamic", [((0, 3, 8, 8), False), ((1, 3, 1, 1), False), ((3, 8, 9), False),
                                           ((2, 3, 9, 11), True)])
def test_pool_backward_edges(compile_fn, assert_close, pool, shape, dynamic):
    """The pools' backwards without their inputs (runtime/pool_backward.py) and the int8 places at
    the edges: an empty batch, a 1x1 plane, an unbatched input, sizes traced as symbols."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)  # takes an unbatched [C, H, W] input too
    ours = copy.deepcopy(conv)
    pooled = (lambda y: F.max_pool2d(y, 3, 2, 1)) if pool == "max" else (lambda y: F.avg_pool2d(y, 3, 2, 1))
    x = torch.randn(*shape)

    def loss(m, x):
        return (pooled(torch.relu(m(x))) * 1.5).sum()
    loss(conv, x).backward()
    torch._dynamo.reset()
    torch.compile(lambda x: loss(ours, x), backend="smelt", dynamic=dynamic)(x).backward()
    for p, q in zip(conv.parameters(), ours.parameters()):
        assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1, 0, 2), (0, 1, 2, 2), (1, 1, 2, 0), (2, 3, 4, 6)])
def test_pixel_unshuffle_of_an_empty_input_has_eagers_shape(device, compile_fn, shape):
    # ATen's CPU kernel returns an input with no elements as it is shaped ((1, 1, 0, 2) stays so),
    # where the decomposition reshaped it to (1, 4, 0, 1) (fuzz seed 4313, program 98); on CUDA
    # eager reshapes it, and so must smelt (the CUDA suite).
    x = torch.randn(*shape, device=device)
    expected = torch.nn.functional.pixel_unshuffle(x, 2)
    actual = compile_fn(lambda x: torch.nn.functional.pixel_unshuffle(x, 2))(x)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected)
