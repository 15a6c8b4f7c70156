"""A kernel's result written over a buffer that dies in it (scheduler/reuse.py)."""
import re

import pytest
import torch
import torch.nn as nn

import smelt

pytestmark = pytest.mark.smelt_only


def _conv_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 12 * 12, 4)).eval()
    for m in net:
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    return net


def _compiled(fn, *args, observe):
    torch._dynamo.reset()
    observe.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend="smelt")(*args)
    return out, observe.compiled_graphs()[-1]


def test_norm_and_activation_write_over_the_convolutions_result(observe):
    net, x = _conv_net(), torch.randn(2, 8, 16, 16)
    out, graph = _compiled(net, x, observe=observe)
    with torch.no_grad():
        torch.testing.assert_close(out, net(x), atol=1e-4, rtol=1e-4)
    assert graph.wrapper_source.count("written over") >= 1  # the second feeds Flatten in NCHW: another layout


def test_the_planned_peak_falls_by_the_buffer_not_allocated(observe, monkeypatch):
    x, w, head = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 4)

    def f(x, w, head):
        return ((x @ w).relu() * 2) @ head  # without reuse the product and its activation meet at the peak
    out, graph = _compiled(f, x, w, head, observe=observe)
    torch.testing.assert_close(out, f(x, w, head))
    assert "written over" in graph.wrapper_source
    monkeypatch.setattr(smelt.pipeline, "plan_reuse", lambda *a: {})
    _, without = _compiled(f, x, w, head, observe=observe)
    assert "written over" not in without.wrapper_source
    assert without.planned_peak_bytes == 2 * 64 * 64 * 4  # the product and its activation
    assert graph.planned_peak_bytes == 64 * 64 * 4 + 64 * 4 * 4  # the product (then the activation) and the result


def test_an_activation_of_another_shape_writes_over_the_product(observe, monkeypatch):
    """A linear layer over [B, H, W, C]: the product is [B*H*W, N], its GELU [B, H, W, N] in the same
    memory (ConvNeXt's MLP where no GEMM epilogue takes the GELU: two 147 MiB buffers at its peak)."""
    monkeypatch.setenv("SMELT_GEMM_EPILOGUES", "0")
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 16)).eval()
    x = torch.randn(2, 5, 3, 16)
    out, graph = _compiled(mlp, x, observe=observe)
    with torch.no_grad():
        torch.testing.assert_close(out, mlp(x), atol=1e-5, rtol=1e-5)
    assert "written over" in graph.wrapper_source, graph.wrapper_source
    assert graph.planned_peak_bytes < 2 * 30 * 48 * 4


def test_a_buffer_read_at_other_elements_is_not_written_over(observe):
    x, w, head = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 4)

    def f(x, w, head):
        y = x @ w
        return (y.flip(-1) + y).relu() @ head  # each element reads its mirror: overwriting would corrupt it
    out, graph = _compiled(f, x, w, head, observe=observe)
    torch.testing.assert_close(out, f(x, w, head))
    assert "written over" not in graph.wrapper_source


def test_a_buffer_two_results_read_is_not_written_over(observe):
    x, w, head = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 4)

    def f(x, w, head):
        y = x @ w
        return (y.relu() * 2) @ head, y.sigmoid() @ head  # one kernel stores both: the second reads y too
    out, graph = _compiled(f, x, w, head, observe=observe)
    for a, e in zip(out, f(x, w, head)):
        torch.testing.assert_close(a, e)
    assert "written over" not in graph.wrapper_source


def test_reuse_while_autotuning(observe):
    # The tuner's trials run on copies of arguments sharing memory (test_autotune covers them).
    net, x = _conv_net(), torch.randn(2, 8, 16, 16)
    with smelt.config.override(autotune=True):
        out, graph = _compiled(net, x, observe=observe)
    assert "written over" in graph.wrapper_source
    with torch.no_grad():
        torch.testing.assert_close(out, net(x), atol=1e-4, rtol=1e-4)


def test_a_kernel_storing_two_results_writes_over_nothing(observe):
    # A training batch norm's kernel stores the biased convolution and its float64 copy: Halide
    # recomputed the first (inlined) for the second after storing it over the convolution's output,
    # and the gradients came out wrong (found by make test's cached training step).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    model(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    with smelt.config.override(channels_last="on"):
        torch.compile(model, backend="smelt")(x).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows, cols", [(7, 13), (3, 1000), (257, 33)])
def test_odd_sizes_written_over_match_eager(rows, cols, observe):
    # A vector tail that recomputed its last elements (rather than guarding them) would read values
    # already written over: every size here leaves a tail.
    x, w, head = torch.randn(rows, 16), torch.randn(16, cols), torch.randn(cols, 3)

    def f(x, w, head):
        return ((x @ w) * 3 + 1).exp() @ head
    out, graph = _compiled(f, x, w, head, observe=observe)
    assert "written over" in graph.wrapper_source
    torch.testing.assert_close(out, f(x, w, head), rtol=1e-5, atol=1e-4)


def test_a_buffer_written_over_and_then_scattered_into_is_taken_once():
    # The fuzzer's program (seed 1970, program 104): the backward writes a buffer over a dying one,
    # then a scatter updates it; the wrapper took the dying buffer's memory again at the scatter,
    # after its `del` (UnboundLocalError).
    x0 = torch.randn(1, 1, 1, 1, requires_grad=True)
    x5, x6 = torch.randn(1, 2, 1, 1, dtype=torch.float64), torch.zeros(1, 2, 1, 1, dtype=torch.int64)

    def fn(x0, x5, x6):
        return torch.cumsum(x0, 1, dtype=torch.float64).scatter_reduce(1, x6, x5, "mean", include_self=False)
    torch._dynamo.reset()
    out = torch.compile(fn, backend="smelt")(x0, x5, x6)
    out.sum().backward()
    expected_grad = x0.grad.clone()
    x0.grad = None
    fn(x0, x5, x6).sum().backward()
    torch.testing.assert_close(out, fn(x0, x5, x6))
    torch.testing.assert_close(expected_grad, x0.grad)


@pytest.mark.parametrize("row_limit", ["4096", "16"])  # rows kept in registers, then looped over
def test_a_reduction_kernels_last_pass_writes_over_a_dying_buffer(observe, monkeypatch, row_limit):
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", row_limit)
    a, b = torch.randn(32, 64), torch.randn(32, 64)

    def f(a, b):
        t = a @ torch.ones(64, 64)  # a product that dies below
        return t * b.softmax(-1)  # the rows' passes read b; only the last reads the product
    out, graph = _compiled(f, a, b, observe=observe)
    torch.testing.assert_close(out, f(a, b), atol=1e-4, rtol=1e-4)
    assert "written over" in graph.wrapper_source


def _lm_head_loss(x, w, target):
    return torch.nn.functional.cross_entropy(x @ w, target)


def test_the_backward_writes_the_logits_gradient_over_the_saved_logits(observe):
    """The saved logits are the backward's to free (AOTAutograd donates them): the cross entropy's
    gradient takes their memory, as Inductor's does (Qwen2's 250 MiB at the training peak)."""
    torch.manual_seed(0)
    x, w = torch.randn(16, 32, requires_grad=True), torch.randn(32, 100, requires_grad=True)
    target = torch.randint(0, 100, (16,))
    torch._dynamo.reset()
    observe.reset()
    loss = torch.compile(_lm_head_loss, backend="smelt")(x, w, target)
    loss.backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    _lm_head_loss(x, w, target).backward()
    torch.testing.assert_close(got, (x.grad, w.grad), atol=1e-4, rtol=1e-4)
    backward = [g for g in observe.compiled_graphs() if g.kind == "backward"][-1]
    assert re.search(r"written over (?!buf\d)\w+", backward.wrapper_source)  # over an input, not a buffer


def test_a_backward_with_donated_inputs_refuses_retain_graph_later():
    """What makes writing over saved activations safe: AOTAutograd refuses to run a backward that
    was compiled with donated inputs a second time over the same saved values."""
    x, w = torch.randn(16, 32, requires_grad=True), torch.randn(32, 100, requires_grad=True)
    target = torch.randint(0, 100, (16,))
    torch._dynamo.reset()
    compiled = torch.compile(_lm_head_loss, backend="smelt")
    compiled(x, w, target).backward()  # compiles the backward with the logits donated
    with pytest.raises(RuntimeError, match="donated"):
        compiled(x, w, target).backward(retain_graph=True)


def test_a_first_backward_that_retains_the_graph_can_run_twice(observe):
    """Compiled under retain_graph=True, a backward has no donated inputs: run twice, it reads
    the saved logits unchanged."""
    torch.manual_seed(0)
    x, w = torch.randn(16, 32, requires_grad=True), torch.randn(32, 100, requires_grad=True)
    target = torch.randint(0, 100, (16,))
    torch._dynamo.reset()
    loss = torch.compile(_lm_head_loss, backend="smelt")(x, w, target)
    loss.backward(retain_graph=True)
    loss.backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    loss = _lm_head_loss(x, w, target)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(got, (x.grad, w.grad), atol=1e-4, rtol=1e-4)


def test_saved_views_of_one_product_are_not_written_over(observe, monkeypatch):
    """AOTAutograd donates two saved halves of one product (its list leaves out aliases of the
    forward's inputs and outputs only); a write over one could land in the other's elements."""
    import smelt.backend
    seen = []
    donated = smelt.backend.donated_saved_inputs
    monkeypatch.setattr(smelt.backend, "donated_saved_inputs", lambda gm: seen.append(donated(gm)) or seen[-1])

    def f(a, b):
        p, q = (a @ b).split(8, dim=1)
        return (p.sin() * q.cos()).sum()
    torch.manual_seed(0)
    a, b = torch.randn(16, 32, requires_grad=True), torch.randn(32, 16, requires_grad=True)
    torch._dynamo.reset()
    torch.compile(f, backend="smelt")(a, b).backward()
    got = (a.grad.clone(), b.grad.clone())
    a.grad = b.grad = None
    f(a, b).backward()
    torch.testing.assert_close(got, (a.grad, b.grad), atol=1e-4, rtol=1e-4)
    assert seen == [frozenset()]  # AOTAutograd listed both halves (bw_donated_idxs [0, 1], torch 2.13)


def test_a_buffer_an_aten_view_reads_is_not_written_over(observe, monkeypatch):
    """A view an ATen call returns keeps reading its base after the base's last kernel reader:
    that kernel must not write over the base (the buffer pool's sibling rule, scheduler/pool.py)."""
    from smelt.lowering import registry
    monkeypatch.delitem(registry.LOWERINGS, torch.ops.aten.diagonal.default)  # runs through ATen: a view

    def f(x, w):
        a = x @ w
        d = torch.ops.aten.diagonal.default(a)  # a view of the product, read at the end
        return a.sin() @ w, d * 2  # the sine is the product's last kernel reader, at its own elements
    x, w = torch.randn(16, 16), torch.randn(16, 16) * 0.1
    out, graph = _compiled(f, x, w, observe=observe)
    for got, expected in zip(out, f(x, w)):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert "written over" not in graph.wrapper_source, graph.wrapper_source


@pytest.mark.parametrize("row_limit", ["4096", "16"])
@pytest.mark.parametrize("rows, cols", [(64, 64), (33, 1000), (8, 5000)])
def test_a_softmax_writes_over_the_scores_it_reduces(rows, cols, row_limit, observe, monkeypatch):
    """Attention written by hand (T5 under SDPA's math path): the scores' max and sum read them in
    the passes before the one writing the probabilities, so the probabilities take the scores'
    memory (T5's bf16 inference peak held both, 64 MiB each, at 1.27x Inductor's). Each row's
    earlier passes end before its last one writes: whole rows in registers (a persistent kernel)
    or looped over in blocks (a row limit of 16)."""
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", row_limit)
    torch.manual_seed(0)
    q, k, v = torch.randn(rows, 16), torch.randn(16, cols), torch.randn(cols, 4)

    def f(q, k, v):
        return torch.softmax((q @ k) + 1.5, dim=-1) @ v
    out, graph = _compiled(f, q, k, v, observe=observe)
    torch.testing.assert_close(out, f(q, k, v), rtol=1e-5, atol=1e-5)
    assert "written over" in graph.wrapper_source, graph.wrapper_source
    assert graph.planned_peak_bytes < 2 * rows * cols * 4


def test_a_norm_writes_over_the_product_it_normalizes(observe):
    torch.manual_seed(0)
    x, w, head = torch.randn(32, 48), torch.randn(48, 96), torch.randn(96, 4)
    norm = nn.LayerNorm(96).eval()

    def f(x, w, head):
        return norm(x @ w) @ head
    out, graph = _compiled(f, x, w, head, observe=observe)
    with torch.no_grad():
        torch.testing.assert_close(out, f(x, w, head), rtol=1e-5, atol=1e-5)
    assert "written over" in graph.wrapper_source, graph.wrapper_source


@pytest.mark.parametrize("row_limit", ["4096", "16"])
def test_a_norm_storing_its_statistics_writes_over_the_residual_sum(observe, monkeypatch, row_limit):
    """A training forward's last norm: the residual stream's sum (dying in it) normalized, its mean
    and inverse deviation stored beside the rows for the backward. The rows take the dying stream's
    memory (ViT-Base's training forward peaked there, 18 MiB over Inductor's on the H200): each
    statistic comes from reductions finished before the rows are written."""
    monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", row_limit)
    torch.manual_seed(0)
    x, w, b, head = torch.randn(24, 64), torch.randn(64, 96), torch.randn(24, 96), torch.randn(96, 4)

    def f(x, w, b, head):
        stream = x @ w  # dies in the norm
        rows, mean, rstd = torch.native_layer_norm(stream + b, [96], None, None, 1e-5)
        return rows @ head, mean, rstd
    out, graph = _compiled(f, x, w, b, head, observe=observe)
    for got, expected in zip(out, f(x, w, b, head)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert "written over" in graph.wrapper_source, graph.wrapper_source


def test_a_second_value_per_element_keeps_the_dying_buffer(observe):
    """Beside the rows, a second value per element (the sum itself, stored) is no per-row statistic:
    Halide computes it in a loop of its own from the inputs, perhaps after the rows overwrote them.
    Nothing is written over the sum's inputs."""
    torch.manual_seed(0)
    x, w, b, head = torch.randn(24, 64), torch.randn(64, 96), torch.randn(24, 96), torch.randn(96, 4)

    def f(x, w, b, head):
        total = x @ w + b
        rows, mean, rstd = torch.native_layer_norm(total, [96], None, None, 1e-5)
        return rows @ head, total * 2, mean, rstd
    out, graph = _compiled(f, x, w, b, head, observe=observe)
    for got, expected in zip(out, f(x, w, b, head)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert "written over" not in graph.wrapper_source, graph.wrapper_source


def test_a_reduction_reading_other_elements_does_not_write_over_them(observe):
    x, w, head = torch.randn(16, 64), torch.randn(64, 64), torch.randn(64, 4)

    def f(x, w, head):
        y = x @ w
        return (torch.softmax(y, -1) + y.flip(-1)) @ head  # the last pass reads each row's mirror
    out, graph = _compiled(f, x, w, head, observe=observe)
    torch.testing.assert_close(out, f(x, w, head), rtol=1e-5, atol=1e-5)
    assert "written over" not in graph.wrapper_source
