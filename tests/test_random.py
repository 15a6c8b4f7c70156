"""Random ops: rand, randn, randint, bernoulli, dropout and the distributions built from them.

The reproducibility contract smelt gives:
- Each call of a compiled function draws fresh seeds from torch's default generator for the
  device, so `torch.manual_seed(s)` before two calls gives bitwise identical outputs, and two calls
  without reseeding give different outputs.
- Kernels compute values with Philox from (seed, element offset); the values are NOT eager's
  (eager runs another generator), so these tests check distributions (moments, rates within
  about five standard errors), shapes, dtypes, exact dropout scaling and forward/backward mask
  consistency, never values against eager.
"""
import math

import pytest
import torch
import torch.nn.functional as F

N = 100_000


def _within(value, expected, stderr, what):
    # Five standard errors: a correct sampler fails this about once in 1.7 million runs.
    assert abs(value - expected) <= 5 * stderr, f"{what}: got {value:.5f}, expected {expected} +- {5 * stderr:.5f}"


# ------------------------------------------------------------------ dropout


@pytest.mark.parametrize("p", [0.3, 0.5])
def test_dropout_train_forward_backward(device, compile_fn, p):
    x = torch.randn(64, 300, device=device, requires_grad=True)
    grad_out = torch.randn(64, 300, device=device)
    out = compile_fn(lambda x: F.dropout(x, p, training=True))(x)
    out.backward(grad_out)
    scale = 1.0 / (1.0 - p)
    kept = out != 0  # randn has no exact zeros: a zero output is a dropped element
    assert out.shape == x.shape and out.dtype == x.dtype
    # Kept elements are scaled by exactly 1 / (1 - p), dropped ones are 0.
    assert torch.equal(out[kept], x.detach()[kept] * scale)
    # The backward uses the forward's mask: gradient is grad_out * mask * scale.
    assert torch.equal(x.grad, torch.where(kept, grad_out * scale, torch.zeros_like(grad_out)))
    _within(1 - kept.float().mean().item(), p, math.sqrt(p * (1 - p) / x.numel()), "drop rate")


def test_dropout_rate_large(device, compile_fn):
    x = torch.ones(N, device=device)
    out = compile_fn(lambda x: F.dropout(x, 0.2, training=True))(x)
    dropped = (out == 0).float().mean().item()
    _within(dropped, 0.2, math.sqrt(0.2 * 0.8 / N), "drop rate")
    assert torch.equal(out.unique(), torch.tensor([0.0, 1.25], device=device))


def test_native_dropout_mask_matches_output(device, compile_fn):
    x = torch.randn(1000, device=device) + 10  # no zeros anywhere
    out, mask = compile_fn(lambda x: torch.ops.aten.native_dropout(x, 0.4, True))(x)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    assert torch.equal(out, x * mask * (1 / 0.6))
    assert 0 < mask.sum() < x.numel()


def test_native_dropout_edge_probabilities(device, compile_fn):
    x = torch.randn(500, device=device)
    fn = compile_fn(lambda x: (torch.ops.aten.native_dropout(x, 0.0, True), torch.ops.aten.native_dropout(x, 1.0, True)))
    (keep_all, mask_all), (drop_all, mask_none) = fn(x)
    assert torch.equal(keep_all, x) and bool(mask_all.all())
    assert torch.equal(drop_all, torch.zeros_like(x)) and not bool(mask_none.any())


def test_native_dropout_eval_is_identity(device, check):
    x = torch.randn(8, 9, device=device)
    check(lambda x: torch.ops.aten.native_dropout(x, 0.5, False), x)


def test_dropout_half_precision(device, compile_fn):
    x = torch.randn(4000, device=device, dtype=torch.bfloat16)
    out = compile_fn(lambda x: F.dropout(x, 0.5, training=True))(x)
    assert out.dtype == torch.bfloat16
    kept = out != 0
    assert torch.equal(out[kept], x[kept] * 2)


def test_dropout_is_one_kernel(device, compile_fn, kernel_count, observe):
    x = torch.randn(32, 50, device=device)
    compile_fn(lambda x: F.dropout(x, 0.5, training=True) + 1)(x)
    assert kernel_count() == 1
    assert not any(g.fallback_ops for g in observe.compiled_graphs())


def test_dropout_training_forward_is_one_kernel(device, compile_fn, kernel_count):
    x = torch.randn(32, 50, device=device, requires_grad=True)
    compile_fn(lambda x: F.dropout(x, 0.5, training=True))(x)
    assert kernel_count() == 1  # the forward graph: draw, compare, scale, and store output and mask


# ------------------------------------------------------------------ reproducibility


@pytest.mark.parametrize("name", ["dropout", "randn", "randint", "bernoulli"])
def test_manual_seed_reproduces_and_calls_differ(device, compile_fn, name):
    fns = {
        "dropout": lambda x: F.dropout(x, 0.5, training=True),
        "randn": lambda x: torch.randn(100, 50, device=x.device) + x,
        "randint": lambda x: torch.randint(0, 1000, (5000,), device=x.device),
        "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    }
    x = torch.randn(100, 50, device=device)
    fn = compile_fn(fns[name])
    torch.manual_seed(123)
    first = fn(x)
    torch.manual_seed(123)
    again = fn(x)
    later = fn(x)
    torch.manual_seed(124)
    other_seed = fn(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, later)
    assert not torch.equal(first, other_seed)


def test_two_random_ops_in_one_graph_are_independent(device, compile_fn):
    x = torch.empty(N, device=device)
    a, b = compile_fn(lambda x: (torch.rand_like(x), torch.rand_like(x)))(x)
    assert not torch.equal(a, b)
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    _within(corr, 0.0, 1 / math.sqrt(N), "correlation")


def test_random_value_read_twice_is_the_same_value(device, compile_fn):
    # One draw used by two consumers: both see the same numbers (recomputed or stored alike).
    x = torch.empty(1000, device=device)

    def fn(x):
        r = torch.rand_like(x)
        return r * 2, r + 1
    doubled, shifted = compile_fn(fn)(x)
    torch.testing.assert_close(doubled / 2, shifted - 1)


def test_uniform_values_agree_across_kernel_shapes(device, compile_fn):
    # A pointwise kernel draws four lanes per Philox call; a reduction picks each lane's word
    # alone. With the same seed both must see the same numbers.
    # Each lane weighed by its position: a plain sum cannot see two lanes of a group swapped.
    x = torch.empty(8, 100, device=device)
    w = torch.arange(100, device=device, dtype=torch.float32)
    torch.manual_seed(7)
    drawn = compile_fn(lambda x: torch.rand_like(x))(x)
    torch.manual_seed(7)
    summed = compile_fn(lambda x, w: (torch.rand_like(x) * w).sum(-1))(x, w)
    torch.testing.assert_close(summed, (drawn * w).sum(-1))


# ------------------------------------------------------------------ distributions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_rand_uniform(device, compile_fn, dtype):
    u = compile_fn(lambda: torch.rand(N, device=device, dtype=dtype))()
    assert u.dtype == dtype and u.shape == (N,)
    assert 0 <= u.min().item() and u.max().item() < 1  # never 1.0, in half precision too
    _within(u.double().mean().item(), 0.5, math.sqrt(1 / 12 / N), "mean")
    _within(u.double().std().item(), math.sqrt(1 / 12), 0.3 / math.sqrt(N), "std")


def test_rand_like_of_a_transposed_tensor(device, compile_fn):
    x = torch.randn(300, 200, device=device).t()
    u = compile_fn(lambda x: torch.rand_like(x))(x)
    assert u.shape == x.shape and u.dtype == x.dtype
    _within(u.mean().item(), 0.5, math.sqrt(1 / 12 / u.numel()), "mean")


@pytest.mark.parametrize("make", ["randn", "randn_like"])
def test_randn_moments(device, compile_fn, make):
    x = torch.empty(400, 250, device=device)
    fn = (lambda x: torch.randn(400, 250, device=x.device)) if make == "randn" else (lambda x: torch.randn_like(x))
    n = compile_fn(fn)(x)
    assert n.shape == (400, 250) and n.dtype == torch.float32
    _within(n.mean().item(), 0.0, 1 / math.sqrt(N), "mean")
    _within(n.std().item(), 1.0, 1 / math.sqrt(2 * N), "std")
    _within((n.abs() < 1).float().mean().item(), 0.6827, math.sqrt(0.6827 * 0.3173 / N), "P(|n| < 1)")


@pytest.mark.parametrize("low,high,dtype", [(0, 10, torch.int64), (-5, 3, torch.int32), (2, 9, torch.float32)])
def test_randint_range_and_dtype(device, compile_fn, low, high, dtype):
    r = compile_fn(lambda: torch.randint(low, high, (N,), device=device, dtype=dtype))()
    assert r.dtype == dtype and r.shape == (N,)
    assert torch.equal(r.unique(), torch.arange(low, high, device=device, dtype=dtype))  # every value, no other
    k = high - low
    _within(r.double().mean().item(), (low + high - 1) / 2, math.sqrt((k * k - 1) / 12 / N), "mean")


def test_randint_high_only_and_like(device, compile_fn):
    x = torch.empty(N, device=device, dtype=torch.float32)
    a, b, c = compile_fn(lambda x: (torch.randint(7, (N,), device=x.device), torch.randint_like(x, 4),
                                   torch.randint_like(x, 3, 6)))(x)
    assert a.dtype == torch.int64 and b.dtype == torch.float32 and c.dtype == torch.float32
    assert torch.equal(a.unique(), torch.arange(7, device=device))
    assert torch.equal(b.unique(), torch.arange(4, device=device, dtype=torch.float32))
    assert torch.equal(c.unique(), torch.arange(3, 6, device=device, dtype=torch.float32))


def test_randint_wide_range(device, compile_fn):
    r = compile_fn(lambda: torch.randint(-2 ** 40, 2 ** 40, (N,), device=device))()
    assert r.min() >= -2 ** 40 and r.max() < 2 ** 40
    _within(r.double().mean().item() / 2 ** 40, 0.0, math.sqrt(1 / 3 / N), "scaled mean")


def test_bernoulli_tensor_probabilities(device, compile_fn):
    p = torch.rand(N, device=device) * 0.5
    out = compile_fn(lambda p: torch.bernoulli(p))(p)
    assert out.dtype == p.dtype and set(out.unique().tolist()) <= {0.0, 1.0}
    expected = p.sum().item()
    _within(out.sum().item(), expected, math.sqrt((p * (1 - p)).sum().item()), "successes")
    assert not bool(out[p == 0].any())


def test_bernoulli_float_probability(device, compile_fn):
    x = torch.empty(N, device=device, dtype=torch.float64)
    out = compile_fn(lambda x: torch.bernoulli(x, 0.3))(x)
    assert out.dtype == torch.float64
    _within(out.mean().item(), 0.3, math.sqrt(0.21 / N), "rate")


def test_inplace_samplers_functional_forms(device, compile_fn):
    x = torch.empty(N, device=device)
    normal, uniform, exponential = compile_fn(lambda x: (torch.empty_like(x).normal_(1.0, 2.0),
                                                         torch.empty_like(x).uniform_(-3.0, 5.0),
                                                         torch.empty_like(x).exponential_(4.0)))(x)
    _within(normal.mean().item(), 1.0, 2 / math.sqrt(N), "normal mean")
    _within(normal.std().item(), 2.0, 2 / math.sqrt(2 * N), "normal std")
    assert -3 <= uniform.min().item() and uniform.max().item() < 5
    _within(uniform.mean().item(), 1.0, 8 / math.sqrt(12 * N), "uniform mean")
    assert exponential.min().item() >= 0
    _within(exponential.mean().item(), 0.25, 0.25 / math.sqrt(N), "exponential mean")


def test_normal_with_tensor_parameters(device, compile_fn):
    mean = torch.linspace(-5, 5, N, device=device)
    std = torch.full((N,), 0.5, device=device)
    out = compile_fn(lambda m, s: (torch.normal(m, s), torch.normal(m, 0.5), torch.normal(2.0, s)))(mean, std)
    for k, sample in enumerate(out[:2]):
        _within((sample - mean).mean().item(), 0.0, 0.5 / math.sqrt(N), f"residual mean {k}")
        _within((sample - mean).std().item(), 0.5, 0.5 / math.sqrt(2 * N), f"residual std {k}")
    _within(out[2].mean().item(), 2.0, 0.5 / math.sqrt(N), "float_Tensor mean")
    sized = compile_fn(lambda: torch.normal(3.0, 0.1, size=(N,), device=device))()
    _within(sized.mean().item(), 3.0, 0.1 / math.sqrt(N), "float_float mean")


def test_heavy_tailed_and_discrete_samplers(device, compile_fn):
    x = torch.empty(N, device=device)
    cauchy, log_normal, geometric = compile_fn(lambda x: (torch.empty_like(x).cauchy_(2.0, 1.0),
                                                          torch.empty_like(x).log_normal_(0.5, 1.0),
                                                          torch.empty_like(x).geometric_(0.25)))(x)
    # Medians: median + 0 for Cauchy, exp(mean) for log-normal; the interquartile range of Cauchy is 2 sigma.
    _within(cauchy.median().item(), 2.0, math.pi / 2 / math.sqrt(N), "cauchy median")
    _within((cauchy.quantile(0.75) - cauchy.quantile(0.25)).item(), 2.0, 0.05, "cauchy IQR")
    assert log_normal.min().item() > 0
    _within(log_normal.log().mean().item(), 0.5, 1 / math.sqrt(N), "log-normal log-mean")
    assert geometric.min().item() >= 1 and torch.equal(geometric, geometric.round())
    _within(geometric.mean().item(), 4.0, math.sqrt(0.75) / 0.25 / math.sqrt(N), "geometric mean")


def test_randperm_runs_in_aten_with_eager_values(device, compile_fn, observe):
    # No lowering: ATen draws from the same generator, so under one seed it even matches eager.
    def fn(x):
        return torch.randperm(x.shape[0], device=x.device) * 2
    x = torch.empty(50, device=device)
    torch.manual_seed(7)
    expected = fn(x)
    torch.manual_seed(7)
    assert torch.equal(compile_fn(fn)(x), expected)
    assert any("randperm" in op for g in observe.compiled_graphs() for op in g.fallback_ops)


# ------------------------------------------------------------------ fusion and shapes


def test_random_fuses_with_its_consumers(device, compile_fn, kernel_count):
    x = torch.randn(64, 64, device=device)
    out = compile_fn(lambda x: (x + torch.randn_like(x) * 0.1).relu().sum(1))(x)
    assert out.shape == (64,)
    assert kernel_count() == 1


def test_zero_dim_and_empty(device, compile_fn):
    scalar, empty = compile_fn(lambda: (torch.rand((), device=device), torch.randn(0, 3, device=device)))()
    assert scalar.shape == () and 0 <= scalar.item() < 1
    assert empty.shape == (0, 3)


def test_dynamic_shapes_dropout(device, compile_fn):
    fn = compile_fn(lambda x: F.dropout(x, 0.25, training=True), dynamic=True)
    for n in (20_000, 30_001):
        x = torch.ones(n, device=device)
        torch.manual_seed(5)
        out = fn(x)
        torch.manual_seed(5)
        assert torch.equal(out, fn(x))
        assert out.shape == (n,)
        _within((out == 0).float().mean().item(), 0.25, math.sqrt(0.25 * 0.75 / n), f"drop rate, n={n}")


def test_module_with_dropout_trains_and_evaluates(device, compile_fn, check):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device)
    x = torch.randn(8, 16, device=device)
    compiled = compile_fn(model)
    model.train()
    compiled(x).square().sum().backward()
    first = model[0].weight.grad
    assert torch.isfinite(first).all() and first.abs().sum() > 0
    model.zero_grad()
    torch.manual_seed(3)
    a = compiled(x)
    torch.manual_seed(3)
    b = compiled(x)
    assert torch.equal(a, b)
    model.eval()
    with torch.no_grad():
        check(model, x, atol=1e-5, rtol=1e-5)
