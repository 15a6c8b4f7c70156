"""Fusion counts (smelt only): how many Triton kernels a graph compiles to."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import allocated_shapes

pytestmark = pytest.mark.smelt_only


def _compile_and_check(compile_fn, assert_close, fn, *args, **tol):
    assert_close(compile_fn(fn)(*args), fn(*args), **tol)


def test_softmax_last_dim_is_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x: F.softmax(x, dim=-1), x, atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1


def test_log_softmax_last_dim_is_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x: F.log_softmax(x, dim=-1), x, atol=1e-5, rtol=1e-5)
    assert kernel_count() == 1


def test_layer_norm_is_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    w = torch.randn(129, device=device)
    b = torch.randn(129, device=device)
    _compile_and_check(
        compile_fn, assert_close, lambda x, w, b: F.layer_norm(x, (129,), w, b), x, w, b, atol=1e-5, rtol=1e-5
    )
    assert kernel_count() == 1


def test_five_pointwise_ops_are_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    y = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x, y: ((x + 1) * 2).sin().exp() - y, x, y)
    assert kernel_count() == 1


def test_broadcast_pointwise_chain_is_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(17, 1, device=device)
    y = torch.randn(1, 33, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x, y: torch.relu(x + y) * y - x.sigmoid(), x, y)
    assert kernel_count() == 1


def test_pointwise_feeding_reduction_is_one_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x: (x.exp() * 2 + 1).sum(dim=-1), x, atol=1e-4, rtol=1e-5)
    assert kernel_count() == 1


def test_two_independent_outputs_of_pointwise_share_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x: (x.sin() + 1, x.sin() * 2), x)
    assert kernel_count() == 1


def test_a_one_element_value_read_twice_is_recomputed_not_stored(device, compile_fn, assert_close, observe,
                                                                   kernel_count):
    # Like Adam's bias correction: a few ops on a step count, read by two expressions of one kernel.
    x = torch.randn(33, 129, device=device)
    step = torch.tensor(3.0, device=device)

    def fn(x, step):
        correction = (1 + 0.5 ** step).sqrt()
        return x / correction + 1e-8 / correction

    _compile_and_check(compile_fn, assert_close, fn, x, step)
    assert kernel_count() == 1
    (graph,) = observe.compiled_graphs()
    assert len(allocated_shapes(graph.wrapper_source)) == 1, graph.wrapper_source  # the output alone


# A call of the cosine (sine) in any backend's kernel: Triton's, or Halide's float32 helper (its
# definition in the module's helpers is not a call).
COSINE_CALL = r"(?<!def )\bcos(?:_float32)?\("
SINE_CALL = r"(?<!def )\bsin(?:_float32)?\("


def test_a_view_read_twice_is_computed_once(device, compile_fn, assert_close, observe):
    # Rotary embeddings: every layer reads cos(emb).unsqueeze(1), one view node; each reader
    # recomputed the cosine for every head until the view's readers counted as its base's.
    emb = torch.randn(16, 8, device=device) * 50
    q = torch.randn(2, 4, 16, 8, device=device)
    k = torch.randn(2, 2, 16, 8, device=device)

    def fn(emb, q, k):
        cos, sin = emb.cos().unsqueeze(0).unsqueeze(0), emb.sin().unsqueeze(0).unsqueeze(0)
        return q * cos + q.flip(-1) * sin, k * cos - k.flip(-1) * sin

    _compile_and_check(compile_fn, assert_close, fn, emb, q, k, atol=1e-5, rtol=1e-5)
    (graph,) = observe.compiled_graphs()
    sources = "\n".join(graph.kernel_sources.values())
    assert len(re.findall(COSINE_CALL, sources)) == 1, sources
    assert len(re.findall(SINE_CALL, sources)) == 1, sources


def test_a_view_read_twice_is_computed_once_under_dynamic_shapes(device, backend, assert_close, observe):
    # Qwen2 under dynamic=True: cos(emb) * scaling (a CPU scalar Dynamo passes), viewed and read by
    # every layer across heads. With symbolic sizes "more elements than the table" was left open,
    # and each layer's kernel recomputed the cosine per head (8 x 260 us on the H200).
    def fn(emb, q, k, scale):
        cos = (emb.cos() * scale).unsqueeze(0).unsqueeze(0)
        sin = (emb.sin() * scale).unsqueeze(0).unsqueeze(0)
        return q * cos + q.flip(-1) * sin, k * cos - k.flip(-1) * sin

    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for t in (16, 11):
        emb = torch.randn(t, 8, device=device) * 50
        q, k = torch.randn(2, 4, t, 8, device=device), torch.randn(2, 2, t, 8, device=device)
        scale = torch.tensor(0.7, dtype=torch.float64)
        assert_close(compiled(emb, q, k, scale), fn(emb, q, k, scale), atol=1e-5, rtol=1e-5)
    (graph,) = observe.compiled_graphs()
    sources = "\n".join(graph.kernel_sources.values())
    assert len(re.findall(COSINE_CALL, sources)) == 1, sources
    assert len(re.findall(SINE_CALL, sources)) == 1, sources


def test_a_value_read_broadcast_through_two_views_is_computed_once(device, compile_fn, assert_close, observe):
    # Its users are two views of its own size; their readers broadcast them over batch and heads.
    emb = torch.randn(16, 8, device=device) * 50
    q, k = torch.randn(2, 4, 16, 8, device=device), torch.randn(3, 16, 8, device=device)

    def fn(emb, q, k):
        c = emb.cos()
        return q * c.view(1, 1, 16, 8), k * c.unsqueeze(0)

    _compile_and_check(compile_fn, assert_close, fn, emb, q, k, atol=1e-5, rtol=1e-5)
    (graph,) = observe.compiled_graphs()
    sources = "\n".join(graph.kernel_sources.values())
    assert len(re.findall(COSINE_CALL, sources)) == 1, sources


def _buffers_each_kernel_takes(graph) -> list[int]:
    """For each kernel launch in a graph's wrapper, how many buffers it is passed."""
    counts = []
    for line in graph.wrapper_source.splitlines():
        call = re.match(r"\s+(\w+)\((.*)\)\s*$", line)
        if call and call.group(1) in graph.kernel_names:
            counts.append(len(re.findall(r"\b(?:buf|arg)\w+", call.group(2))))
    return counts


@pytest.mark.parametrize("gather", [False, True])
def test_a_residual_stream_read_through_a_view_is_not_summed_again_by_each_layer(device, compile_fn, assert_close,
                                                                               observe, gather):
    # OPT's decoder: each residual sum's one user is a view, read by the next norm and the next sum.
    # Judged by its direct users alone, no sum was ever stored: each layer's norm recomputed the sum
    # of every layer before it (here the last kernel took 8 buffers; OPT's kernels 0.82 ms a call
    # against Inductor's 0.34 on the H200). `gather`: the stream starts from embedding rows, as OPT's does.
    d, layers = 32, 6
    x = torch.randn(4, 8, d, device=device)
    table, ids = torch.randn(50, d, device=device), torch.randint(0, 50, (4, 8), device=device)
    ws = [torch.randn(d, d, device=device) / d ** 0.5 for _ in range(layers)]

    def fn(x, table, ids, *ws):
        h = (F.embedding(ids, table) if gather else x) * 2
        for w in ws:
            flat = h.view(-1, d)
            h = (flat + F.layer_norm(flat, (d,)) @ w).view(4, 8, d)
        return F.layer_norm(h, (d,))

    _compile_and_check(compile_fn, assert_close, fn, x, table, ids, *ws, atol=1e-4, rtol=1e-4)
    (graph,) = observe.compiled_graphs()
    taken = _buffers_each_kernel_takes(graph)
    assert len(taken) >= layers and max(taken) <= 5, (taken, graph.wrapper_source)


def test_a_cast_viewed_for_a_log_softmax_is_not_stored(device, compile_fn, assert_close, observe):
    # A language model's loss: logits.float().view(-1, vocab), read by the log softmax's two passes.
    # Readers of the view's own size recompute the cast; storing it wrote 500 MB for Qwen2 and
    # raised the peak by as much.
    x = torch.randn(2, 8, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(40, 16, device=device, dtype=torch.bfloat16)
    t = torch.randint(0, 40, (16,), device=device)

    def fn(x, w, t):
        logits = (x @ w.t()).float()
        return F.cross_entropy(logits.view(-1, 40), t)

    _compile_and_check(compile_fn, assert_close, fn, x, w, t, atol=1e-4, rtol=1e-4)
    (graph,) = observe.compiled_graphs()
    assert (2, 8, 40) not in allocated_shapes(graph.wrapper_source), graph.wrapper_source


def test_a_sum_read_by_two_reductions_is_recomputed_not_stored(device, compile_fn, assert_close, observe):
    # A norm backward: the float32 sum of two bfloat16 gradients feeds the input's gradient (a
    # reduction along rows) and the weight's (along columns, another kernel). Recomputing it loads
    # 4 bytes per element where storing it wrote 4 and read them back.
    a = torch.randn(64, 32, device=device, dtype=torch.bfloat16)
    b = torch.randn(64, 32, device=device, dtype=torch.bfloat16)
    x = torch.randn(64, 32, device=device)
    w = torch.randn(32, device=device)

    def fn(a, b, x, w):
        g = a.float() + b.float()
        return (g * w).sum(-1, keepdim=True) * x, (g * x).sum(0)

    _compile_and_check(compile_fn, assert_close, fn, a, b, x, w, atol=1e-4, rtol=1e-4)
    (graph,) = observe.compiled_graphs()
    assert allocated_shapes(graph.wrapper_source).count((64, 32)) == 1, graph.wrapper_source  # the output


def test_a_norm_gradient_of_many_loads_read_twice_is_recomputed_not_stored(device, compile_fn, assert_close, observe):
    # A ViT's last norm's input gradient (the class token's gradient scattered over the tokens):
    # 6 loads and 9 ops; read by its bfloat16 cast for a product and by the residual's sum much
    # later. Stored, the float32 buffer stood at the H200's training peak (18 MiB); its readers
    # recompute it from what they load anyway. The op limit counts arithmetic, not loads.
    B, T, D = 4, 9, 32
    dy = torch.randn(B, D, device=device)
    w = torch.randn(D, device=device)
    xhat = torch.randn(B, T, D, device=device)
    rstd = torch.rand(B, T, 1, device=device) + 0.5
    r = torch.randn(B, T, D, device=device)
    W = torch.randn(D, 16, device=device, dtype=torch.bfloat16)

    def fn(dy, w, xhat, rstd, r, W):
        first = (torch.arange(T, device=dy.device) == 0)[None, :, None]
        g = torch.where(first, dy[:, None, :], 0.0) * w
        s1 = g.sum(-1, keepdim=True)
        s2 = (g * xhat).sum(-1, keepdim=True)
        dx = rstd * (g * D - s1 - xhat * s2) / D
        return dx.to(torch.bfloat16) @ W, (dx + r).sum(0)

    _compile_and_check(compile_fn, assert_close, fn, dy, w, xhat, rstd, r, W, atol=2e-2, rtol=2e-2)
    (graph,) = observe.compiled_graphs()
    assert allocated_shapes(graph.wrapper_source).count((B, T, D)) <= 1, graph.wrapper_source  # the cast


def test_the_op_counter_counts_a_reused_value_once_as_distinct():
    """A kernel computes a repeated subexpression once: `distinct_ops` counts it so (the recompute
    rule's limit), `ops` each time the body uses it."""
    from smelt.ir.ops import OpCounter, ops, use_handler
    counter = OpCounter()
    with use_handler(counter):
        x = ops.load("x", "i")
        e = ops.exp(x)
        ops.add(ops.mul(e, e), ops.exp(x))
    assert (counter.ops, counter.distinct_ops) == (5, 4)
    long = OpCounter()  # texts past TextHandler.NAME_ABOVE get names: one per distinct text
    with use_handler(long):
        y = ops.load("a_buffer_with_a_long_name", "i0 + 4096*i1 + 1048576*i2")
        ops.add(ops.exp(ops.sin(y)), ops.exp(ops.sin(y)))
    assert (long.ops, long.distinct_ops) == (6, 4)


def test_a_value_two_products_read_is_stored_once(device, compile_fn, assert_close, observe):
    # A value each reader would recompute, read by two ATen products (a gradient by grad @ W and
    # grad^T @ x): each product asks for memory, and recomputed, each got a copy of its own
    # (BERT's padded logits gradient twice over, 238 MiB more at its AMP training peak).
    g0 = torch.randn(24, 40, device=device)
    w, x = torch.randn(40, 8, device=device), torch.randn(24, 8, device=device)

    def fn(g0, w, x):
        g = g0 * 2 + 1
        return g @ w, g.t() @ x, g.sum(0)

    _compile_and_check(compile_fn, assert_close, fn, g0, w, x, atol=1e-4, rtol=1e-4)
    (graph,) = observe.compiled_graphs()
    shapes = allocated_shapes(graph.wrapper_source)
    assert shapes.count((24, 40)) + shapes.count((40, 24)) == 1, graph.wrapper_source


def test_a_softmax_row_step_two_products_read_is_stored_once(device, compile_fn, assert_close, observe):
    # The sibling through the softmax rule: a row's shifted exponent, which the softmax's kernels
    # recompute, read by two products as well (attention normalized after its product).
    s, v, w = torch.randn(24, 40, device=device), torch.randn(40, 8, device=device), torch.randn(24, 8, device=device)

    def fn(s, v, w):
        p = (s - s.amax(-1, keepdim=True)).exp()
        return (p @ v) / p.sum(-1, keepdim=True), p.t() @ w

    _compile_and_check(compile_fn, assert_close, fn, s, v, w, atol=1e-4, rtol=1e-4)
    (graph,) = observe.compiled_graphs()
    shapes = allocated_shapes(graph.wrapper_source)
    assert shapes.count((24, 40)) + shapes.count((40, 24)) == 1, graph.wrapper_source


def test_a_narrowing_cast_read_twice_is_stored(device, compile_fn, assert_close, observe):
    # The other side of the rule: a bfloat16 copy of a float32 value is cheaper to read back (2
    # bytes) than to recompute from its input (4).
    x = torch.randn(64, 32, device=device)

    def fn(x):
        h = (x * 3).to(torch.bfloat16)
        return h.sum(0), h.float().sum(1)

    _compile_and_check(compile_fn, assert_close, fn, x, atol=1e-2, rtol=1e-2)
    (graph,) = observe.compiled_graphs()
    assert (64, 32) in allocated_shapes(graph.wrapper_source), graph.wrapper_source


def test_pure_view_graph_needs_no_kernel(device, compile_fn, assert_close, kernel_count):
    x = torch.randn(33, 129, device=device)
    _compile_and_check(compile_fn, assert_close, lambda x: x.t()[2:], x)
    assert kernel_count() == 0


def test_observe_record_is_consistent_with_extern_mm(device, compile_fn, assert_close, observe):
    # extern calls must not break bookkeeping: every kernel name has a source
    a = torch.randn(17, 33, device=device)
    b = torch.randn(33, 9, device=device)
    _compile_and_check(compile_fn, assert_close, lambda a, b: torch.relu(a @ b) + 1, a, b, atol=1e-4, rtol=1e-4)
    for g in observe.compiled_graphs():
        assert set(g.kernel_names) == set(g.kernel_sources), (g.kernel_names, list(g.kernel_sources))
        assert len(set(g.kernel_names)) == len(g.kernel_names)
        assert isinstance(g.wrapper_source, str) and g.wrapper_source
        for name in g.kernel_names:
            assert name in g.wrapper_source, f"kernel {name} is never launched by the wrapper"


def test_compiled_graphs_are_recorded_in_order_and_reset_clears(device, compile_fn, observe):
    x = torch.randn(17, 33, device=device)
    compile_fn(lambda x: x.exp())(x)
    compile_fn(lambda x: x.softmax(-1))(x)
    graphs = observe.compiled_graphs()
    assert len(graphs) == 2
    assert [g.kind for g in graphs] == ["inference", "inference"]
    observe.reset()
    assert observe.compiled_graphs() == []


def test_a_value_whose_other_reader_takes_only_its_size_is_not_stored(device, check, observe):
    """Cross-entropy's backward: log-probabilities read by exp and by full_like (for a one-hot
    scatter): computed inside the one kernel that reads them, not written out first."""
    x = torch.randn(6, 33, device=device)
    target = torch.randint(0, 33, (6, 1), device=device)

    def f(x, target):
        logp = x - x.logsumexp(1, keepdim=True)
        onehot = torch.full_like(logp, 0).scatter(1, target, -1.0)
        return onehot + logp.exp()

    check(f, x, target)
    (graph,) = observe.compiled_graphs()
    assert allocated_shapes(graph.wrapper_source).count((6, 33)) == 1, graph.wrapper_source  # the result


def test_a_recomputed_value_asked_for_memory_later_gets_a_copy_of_its_own():
    # Readers lowered before a later op (an extern call, an output) asks for a recomputed value's
    # memory may load through its box when their kernels are generated: the box must stay a loop
    # nest, or they read a buffer computed after them (resnet18's training read one, unassigned).
    import torch.fx
    from smelt.ir import Pointwise, StorageBox
    from smelt.ir.graph import IRGraph
    from smelt.ir.ops import ReadsHandler, ops, use_handler
    graph = IRGraph(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()))
    loops = Pointwise(torch.device("cpu"), torch.float32, lambda idx: ops.load("x", idx[0]), [8])
    box = StorageBox(loops)
    box.keep_recomputed()
    first, again = box.realize(graph), box.realize(graph)
    assert first is again and not box.is_realized()
    reads = ReadsHandler()
    with use_handler(reads):
        box.make_loader()([0])
    assert [name for name, _ in reads.reads] == ["x"]  # still recomputed from its input



def _t5_buckets(q, k, nb=8, maxd=16):
    rel = torch.arange(k)[None, :] - torch.arange(q)[:, None]
    nb //= 2
    out = (rel > 0).to(torch.long) * nb
    rel = torch.abs(rel)
    max_exact = nb // 2
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(maxd / max_exact)
                         * (nb - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, nb - 1))
    return out + torch.where(rel < max_exact, rel, large)


def test_integer_values_recomputed_by_their_readers_match_eager(monkeypatch):
    """Integer values stay stored for cost (their readers use them as addresses); recomputed, as
    floats are, T5's position buckets came out wrong in Halide (1e35, nan) until a later asker
    stopped realizing a recomputed box in place (`keep_recomputed`). Checked here with the
    integer rule lifted, on the bucket program and the tiny T5 through the model suite."""
    import smelt.lowering.graph
    from smelt.tools.model_suite.runner import run_case
    from smelt.tools.model_suite.zoo import all_specs
    monkeypatch.setattr(smelt.lowering.graph, "recomputes_dtype", lambda dtype: True)
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    w = torch.randn(8, 4)

    def fn(w):
        return w[_t5_buckets(16, 16)].permute(2, 0, 1)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="smelt")(w), fn(w))
    for mode in ("infer_fp32", "train"):
        torch._dynamo.reset()
        result = run_case(all_specs()["t5"], mode, "tiny", "cpu", "smelt")
        assert result.status == "pass", (mode, result)
