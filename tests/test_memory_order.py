"""Kernels run where their inputs die, not later: outputs computed in program order
(lowering/graph.py), combo members that move back only where memory cannot grow
(scheduler/combo.py), and steps that free more than they allocate run as soon as they can
(scheduler/memory_order.py). Qwen2's AMP backward held every bfloat16 weight gradient and norm input
until its last kernel, which made all their float32 casts and column sums at once."""
import os

import pytest
import torch

import smelt
from conftest import DEVICE, inspects_triton_kernels, peak_bytes_of_call

pytestmark = pytest.mark.smelt_only


def _compiled(fn, *args, observe, memory_order=True):
    torch._dynamo.reset()
    observe.reset()
    with smelt.config.override(memory_order=memory_order):
        out = torch.compile(fn, backend="smelt")(*args)
    return out, observe.compiled_graphs()[-1]


def _slices_of_products(a, b, c, d):
    # Each scaled slice is an output only: left for the output node, all three products would live
    # to the end (as a backward's weight gradients did before their float32 casts).
    return (a @ b)[:, :8] * 2, (a @ c)[:, :8] * 2, (a @ d)[:, :8] * 2


def test_an_output_is_computed_where_the_program_computes_it(observe, monkeypatch):
    a, b, c, d = (torch.randn(64, 64, device=DEVICE) for _ in range(4))
    out, graph = _compiled(_slices_of_products, a, b, c, d, observe=observe)
    for got, want in zip(out, _slices_of_products(a, b, c, d)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    product = 64 * 64 * 4
    assert graph.planned_peak_bytes < 2 * product  # one product alive at a time, beside the small slices
    peak_line = next(line for line in graph.wrapper_source.splitlines() if line.startswith("PLANNED_PEAK_BYTES"))
    assert "16.0 KiB" in peak_line.split("at once:")[1]  # the wrapper names the peak's buffers: the product
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    monkeypatch.setattr(smelt.lowering.graph, "_realize_output_in_place", lambda *a: None)
    _, deferred = _compiled(_slices_of_products, a, b, c, d, observe=observe)
    assert deferred.planned_peak_bytes >= 3 * product  # the test fails without the change


def _products_summed_one_at_a_time(a, b, c, d, e):
    # A weight shared by several layers: its gradient is summed one layer at a time, each partial
    # sum read only after the next layer's product (ALBERT's backward).
    total = a @ b + a @ c
    total = total + a @ d
    total = total + a @ e
    return total.relu()


def test_a_sum_read_after_later_products_is_stored_where_it_is_computed(observe, monkeypatch):
    a, b, c, d, e = (torch.randn(128, 128, device=DEVICE) for _ in range(5))
    out, graph = _compiled(_products_summed_one_at_a_time, a, b, c, d, e, observe=observe)
    torch.testing.assert_close(out, _products_summed_one_at_a_time(a, b, c, d, e), atol=1e-3, rtol=1e-4)
    product = 128 * 128 * 4
    assert graph.planned_peak_bytes <= 3 * product  # a partial sum and the next product, not every product
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    monkeypatch.setattr(smelt.lowering.graph, "_realize_before_a_distant_reader", lambda *a: None)
    _, lazy = _compiled(_products_summed_one_at_a_time, a, b, c, d, e, observe=observe)
    assert lazy.planned_peak_bytes >= 4 * product  # the test fails without the rule: all four alive


def _inputs_summed_and_read_after_a_product(a, b, w):
    total = a + b  # reads only the caller's tensors, which no kernel of the graph frees
    return total * (w @ w)


def test_a_sum_of_the_callers_tensors_stays_fused_into_its_distant_reader(observe):
    a, b, w = (torch.randn(128, 128, device=DEVICE) for _ in range(3))
    out, graph = _compiled(_inputs_summed_and_read_after_a_product, a, b, w, observe=observe)
    torch.testing.assert_close(out, _inputs_summed_and_read_after_a_product(a, b, w), atol=1e-3, rtol=1e-4)
    assert len(graph.kernel_names) == 1, graph.kernel_names  # stored, it would free nothing and cost a kernel


def _fills_around_a_temporary(x):
    first = torch.zeros(1 << 19, device=x.device)  # 2 MiB each: larger than combo.MOVE_BYTES
    total = (x @ x).relu().sum()  # a 1 MiB temporary between the two fills
    second = torch.zeros(1 << 19, device=x.device)
    return first, total, second


def test_a_combo_member_does_not_move_back_to_allocate_earlier(observe, monkeypatch):
    x = torch.randn(512, 512, device=DEVICE)
    # memory_order.py would hold the output-only fills back itself: the combo's own rule is tested
    out, graph = _compiled(_fills_around_a_temporary, x, observe=observe, memory_order=False)
    for got, want in zip(out, _fills_around_a_temporary(x)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
    inspects_triton_kernels()
    fill, temporary = 4 << 19, 4 << 18
    assert graph.planned_peak_bytes <= 2 * fill + 64  # the second fill after the temporary has died
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    monkeypatch.setattr(smelt.scheduler.combo, "MOVE_BYTES", 1 << 40)
    _, moved = _compiled(_fills_around_a_temporary, x, observe=observe, memory_order=False)
    assert moved.planned_peak_bytes >= 2 * fill + temporary  # the test fails without the rule


def _cat_after_a_temporary(x, y):
    small = x[:8].sin()  # an early kernel of its own: a combo partner
    total = (x @ x).relu().sum()  # a 1 MiB temporary
    # A cat of nine pieces is a storage its pieces are written into (2 MiB); the eight slices of y
    # (1 MiB together) depend on y alone, so their kernel could move back to the sin's launch.
    return small, total, torch.cat([y * k for k in range(2, 10)] + [x * total])


def test_a_combo_member_writing_a_cat_counts_the_cat_it_allocates(observe):
    x, y = torch.randn(512, 512, device=DEVICE), torch.randn(64, 512, device=DEVICE)
    out, graph = _compiled(_cat_after_a_temporary, x, y, observe=observe, memory_order=False)
    for got, want in zip(out, _cat_after_a_temporary(x, y)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
    inspects_triton_kernels()
    # Counted as its slices' 1 MiB, within the combo pass's free moves, the whole 2 MiB cat was
    # allocated before the product's 1 MiB temporary: 3 MiB at once.
    assert graph.planned_peak_bytes < (5 << 19), graph.wrapper_source


def _scaled_weights_then_a_temporary(x, w1, w2):
    first = w1 * 2  # 2 MiB each: two kernels of one body (a forward's weight casts)
    small = x[:8].sin().sum()
    second = w2 * 2
    total = (x @ x).relu().sum()  # the peak comes later, with both scaled weights alive anyway
    return first, small, second, total


def test_a_combo_member_moves_back_where_the_peak_allows(observe):
    x, w1, w2 = torch.randn(512, 512, device=DEVICE), torch.randn(1 << 19, device=DEVICE), \
        torch.randn(1 << 19, device=DEVICE)
    out, graph = _compiled(_scaled_weights_then_a_temporary, x, w1, w2, observe=observe, memory_order=False)
    for got, want in zip(out, _scaled_weights_then_a_temporary(x, w1, w2)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-4)
    inspects_triton_kernels()
    launches = [line.strip() for line in graph.wrapper_source.splitlines() if line.strip().startswith("triton_")]
    assert len(launches) == 3 and launches[0].startswith("triton_combo"), launches  # both scalings in one


class _Mlp(torch.nn.Module):
    """A transformer's MLP with its residual: the backward's products over the hidden layer are
    the input gradient (a fresh [tokens, 4 x dim] buffer) and the weight gradient (after which the
    saved activation, [tokens, 4 x dim] too, dies)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _backward_graph(model, x, observe, monkeypatch, memory_order: bool):
    """The compiled step's gradients, its backward graph, and the most bytes its backward held over
    what it began with (the saved values it frees counted down), its workspace included."""
    torch._dynamo.reset()
    observe.reset()
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    model.zero_grad()
    with smelt.config.override(memory_order=memory_order):
        compiled = torch.compile(model, backend="smelt")
        compiled(x).square().sum().backward()  # compiles both graphs
        model.zero_grad()
        peak = peak_bytes_of_call(lambda loss: loss.backward(), x.device, setup=lambda: compiled(x).square().sum())
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    graph = observe.compiled_graphs()[-1]
    # The CPU workspace (its buffers, products' results among them) is held from the first call on.
    workspace = graph.call.__globals__.get("cpu_workspace")
    return grads, graph, peak + (workspace.size if workspace is not None else 0)


def _reordered_and_traced(model, x, observe, monkeypatch):
    """(backward graph, backward peak) with the reorder and without it; the reordered step's
    gradients checked against eager's."""
    model(x).square().sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    grads, graph, peak = _backward_graph(model, x, observe, monkeypatch, memory_order=True)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], atol=1e-3, rtol=1e-4)
    _, traced, traced_peak = _backward_graph(model, x, observe, monkeypatch, memory_order=False)
    return (graph, peak), (traced, traced_peak)


def _product_lines(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if "torch.mm(" in line or "torch.addmm(" in line]


def test_a_weight_gradient_runs_before_the_input_gradient_to_free_its_saved_input(observe, monkeypatch):
    """The saved GELU output dies with the weight gradient's product: run first, it is freed before
    the input gradient's buffer of its size is allocated (ViT-Base's AMP training step held both, one
    37 MiB block above Inductor's peak). The gradients stay eager's."""
    torch.manual_seed(0)
    x = torch.randn(8, 256, 64, device=DEVICE)  # [2048, 256] float32 hidden layer: 2 MiB
    (graph, peak), (traced, traced_peak) = _reordered_and_traced(_Mlp(64).to(DEVICE), x, observe, monkeypatch)
    # fc2's products read the incoming gradient: the traced order has its input gradient first.
    first, reordered = _product_lines(traced.wrapper_source)[0], _product_lines(graph.wrapper_source)[0]
    assert "primals" in first and "primals" not in reordered, (first, reordered)
    if DEVICE == "cpu" and os.environ.get("SMELT_CPU_BACKEND") == "triton":
        return  # Triton's interpreter copies each launch's arguments: its copies set the peak
    hidden = 2048 * 256 * 4  # the traced order's peak holds two of these beside the saved values
    assert peak <= traced_peak - hidden // 4, (peak, traced_peak)  # the next peak comes later, lower


def _reads_then_overwrites(a, x, w):
    big = x @ w  # 4 MiB, dead once summed
    before = a[:512] * 3  # reads a's old value: another size than the sum, so another kernel
    a.copy_(big[0] + big[-1])  # frees 4 MiB and allocates nothing: the order would run it first if it could
    return before


def test_a_write_into_an_input_waits_for_the_reads_of_its_old_value(observe, monkeypatch):
    """The reorder keeps each step after the steps before it that read what it writes."""
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    torch.manual_seed(0)
    a, x, w = (torch.randn(1024, device=DEVICE), torch.randn(1024, 1024, device=DEVICE),
               torch.randn(1024, 1024, device=DEVICE))
    expected_a = a.clone()
    expected = _reads_then_overwrites(expected_a, x, w)
    torch._dynamo.reset()
    observe.reset()
    got = torch.compile(_reads_then_overwrites, backend="smelt")(a, x, w)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a, expected_a, atol=1e-2, rtol=1e-4)


class _PooledHead(torch.nn.Module):
    """Tokens through a wide layer, pooled, then a classifier: the backward starts with the
    classifier's weight gradient (4 MiB, read by nothing but the output) and then works through
    the wide layer's gradients (8 MiB temporaries)."""

    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(64, 512), torch.nn.Linear(512, 2048)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.body(x)).mean(1))


# Planned above the kernel backend; under Triton's interpreter the model's run takes 35 s and its peak
# is not checked (below), so `make test` runs it in the Halide pass only.
@pytest.mark.cpu_backend_independent
def test_a_weight_gradient_only_the_output_reads_waits_until_memory_is_lower(observe, monkeypatch):
    """Held back to the end of the backward, the classifier's weight gradient is not alive beside
    the wide layer's temporaries (EfficientNet's classifier beside a convolution's backward)."""
    torch.manual_seed(0)
    x = torch.randn(8, 512, 64, device=DEVICE)
    _check_head_gradient_held_back(_PooledHead(), x, "(512, 64,)", observe, monkeypatch)


def _check_head_gradient_held_back(model, x, body_gradient: str, observe, monkeypatch):
    """The traced order plans the head's [2048, 512] weight gradient before the body's (shape
    `body_gradient`); the reordered one after it, with a peak lower by at least half that gradient."""
    (graph, peak), (traced, traced_peak) = _reordered_and_traced(model.to(DEVICE), x, observe, monkeypatch)

    def head_before_body(source):  # where the two weight gradients' products are planned
        return source.index("(2048, 512,)") < source.index(body_gradient)
    assert head_before_body(traced.wrapper_source) and not head_before_body(graph.wrapper_source)
    if DEVICE == "cpu" and os.environ.get("SMELT_CPU_BACKEND") == "triton":
        return  # Triton's interpreter copies each launch's arguments: its copies set the peak
    head_gradient = 2048 * 512 * 4
    assert peak <= traced_peak - head_gradient // 2, (peak, traced_peak)


class _TiedHead(torch.nn.Module):
    """Tokens embedded, through a wide layer, pooled, then a head tied to the embedding: the backward
    starts with the head's weight gradient (4 MiB), which only its sum with the embedding's gradient
    reads, at the backward's end, and then works through the wide layer's gradients (8 MiB)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(2048, 512)
        self.body, self.back = torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 512)

    def forward(self, ids):
        h = self.back(torch.nn.functional.gelu(self.body(self.embed(ids))))
        return h.mean(1) @ self.embed.weight.t()


@pytest.mark.cpu_backend_independent  # as above
def test_a_tied_heads_weight_gradient_waits_for_the_sum_at_the_end(observe, monkeypatch):
    """Its reader leads only to the output: held back with it, the head's gradient is not alive
    beside the wide layer's temporaries (Whisper's CPU training peak 475.0 -> 439.4 MiB)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 2048, (8, 256), device=DEVICE)
    _check_head_gradient_held_back(_TiedHead(), ids, "(1024, 512,)", observe, monkeypatch)


def test_the_estimate_counts_a_result_written_over_its_dying_input_in_that_inputs_memory():
    from smelt.scheduler.live_bytes import live_bytes
    sizes = {"a": 100, "b": 100, "c": 50, "d": 100}
    made, reads = [["a"], ["b"], ["c"]], [[], ["a"], ["b"]]
    assert live_bytes(made, reads, sizes, [], set()) == [100, 200, 150]
    # b over a (read last there), c over b (so over a's memory): one block of 100 bytes throughout.
    over = [[], [("b", ["a"])], [("c", ["b"])]]
    assert live_bytes(made, reads, sizes, [], set(), over) == [100, 100, 100]
    # a read again later is not dying where b is made: b takes memory of its own, c still goes over b.
    made, reads = made + [["d"]], reads + [["a", "c"]]
    assert live_bytes(made, reads, sizes, [], {"d"}) == [100, 200, 250, 250]
    assert live_bytes(made, reads, sizes, [], {"d"}, over + [[]]) == [100, 200, 200, 300]


def test_steps_are_ordered_by_what_they_read():
    """scheduler.schedule.in_dependency_order on stand-in steps: a reader registered before the
    buffer it reads moves after it; a write into an input stays after the readers of its old value
    placed before it, and before those placed after it; writes into one buffer keep their order."""
    from types import SimpleNamespace

    from smelt.scheduler.schedule import in_dependency_order

    def step(name, reads=(), writes=None, fills=None):
        return SimpleNamespace(name=name, write_name=writes or name, fills=fills, read_names=set(reads), position=None)
    nodes = [step("pool", reads={"stack"}),  # registered before what it reads
             step("old_reader", reads={"arg0"}),
             step("stack", reads={"arg1"}),
             step("update", reads={"arg0"}, writes="arg0"),  # the input written in place
             step("new_reader", reads={"arg0"}),
             step("fill_a", fills="cat"), step("fill_b", fills="cat"), step("cat_reader", reads={"cat"})]
    for k, n in enumerate(nodes):
        n.position = k
    order = [n.name for n in in_dependency_order(nodes)]
    assert order == ["old_reader", "stack", "pool", "update", "new_reader", "fill_a", "fill_b", "cat_reader"], order
    assert [n.position for n in in_dependency_order(nodes)] == list(range(len(nodes)))
    in_order = [step("a"), step("b", reads={"a"})]
    for k, n in enumerate(in_order):
        n.position = k
    assert in_dependency_order(in_order) == in_order
