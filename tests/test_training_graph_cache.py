"""Training graphs at the graph cache's Dynamo level (smelt/graph_cache/training_graph.py): a later
compile of the same training step runs the cached forward and backward through smelt's own
autograd.Function, skipping AOTAutograd, and must give what eager gives: outputs, every gradient,
buffers a step writes, and the same errors where AOTAutograd's wrapper raises.

Each test compiles twice (the first compile stores, the second hits; `torch._dynamo.reset()` in
between, as a fresh process would) and checks both against eager.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_compile_cache import REPO_ROOT, cache_dir  # noqa: F401  (the fixture)

from smelt import graph_cache

pytestmark = pytest.mark.smelt_only


def compiled_step(fn, *args, compile_fn, **kw):
    """`fn(*args)` compiled from scratch (Dynamo's in-memory cache cleared), and this compile's counts."""
    torch._dynamo.reset()
    graph_cache.stats.clear()
    return compile_fn(fn, **kw)(*args), graph_cache.stats


def grads(module) -> dict:
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def expect_counts(stats, attempt):
    """The first compile stores the entry (once its backward has compiled), the second hits it."""
    if attempt == 0:
        assert stats["dynamo_stored"] == 1 and stats.get("dynamo_hit", 0) == 0, dict(stats)
    else:
        assert dict(stats) == {"dynamo_hit": 1}, dict(stats)


def matches_eager_twice(model, step, x, compile_fn, assert_close, tolerance):
    """`step(x)`'s loss and the model's gradients (same dtype as eager's), stored then hit."""
    expected = step(x)
    expected.backward()
    expected_grads = grads(model)
    for attempt in range(2):
        model.zero_grad()
        out, stats = compiled_step(step, x, compile_fn=compile_fn)
        out.backward()
        expect_counts(stats, attempt)
        assert_close(out, expected, atol=tolerance, rtol=tolerance)
        for name, grad in grads(model).items():
            assert grad.dtype == expected_grads[name].dtype
            assert_close(grad, expected_grads[name], atol=tolerance, rtol=tolerance)


def test_a_training_step_hits_and_gives_eagers_gradients(cache_dir, device, compile_fn, assert_close):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to(device)
    x = torch.randn(8, 16, device=device)

    def step(x):
        return model(x).square().mean()
    matches_eager_twice(model, step, x, compile_fn, assert_close, tolerance=1e-5)


def test_outputs_without_grad_and_unused_outputs(cache_dir, device, compile_fn, assert_close):
    """An output that needs no grad is not differentiable (its grad is never asked for); an output
    the loss does not use gets a zero gradient; only the outputs that need grad take tangents."""
    torch.manual_seed(0)
    w = torch.randn(12, 6, device=device, requires_grad=True)
    x = torch.randn(5, 12, device=device)

    def fn(x):
        h = x @ w
        return h.relu(), h.argmax(-1), h.detach() * 2, h.sigmoid()
    expected = fn(x)
    expected[0].sum().backward()
    expected_grad = w.grad.clone()
    for attempt in range(2):
        w.grad = None
        out, stats = compiled_step(fn, x, compile_fn=compile_fn)
        assert [o.requires_grad for o in out] == [True, False, False, True]
        out[0].sum().backward()  # the fourth output's gradient arrives as None
        expect_counts(stats, attempt)
        for got, want in zip(out, expected):
            assert_close(got, want)
        assert_close(w.grad, expected_grad)


def test_an_output_viewing_an_intermediate(cache_dir, device, compile_fn, assert_close):
    """An output that is a view of the graph's own intermediate (GPT-2's hidden states, reshaped):
    AOTAutograd returns it through `_unsafe_view`, and so does the hit; such graphs hit too."""
    torch.manual_seed(0)
    w = torch.randn(12, 12, device=device, requires_grad=True)
    x = torch.randn(2, 6, 12, device=device)

    def fn(x):
        h = torch.tanh(x @ w)
        return h.view(12, 12), h.sum()
    expected = fn(x)
    (expected[0].square().sum() + expected[1]).backward()
    expected_grad = w.grad.clone()
    for attempt in range(2):
        w.grad = None
        out, stats = compiled_step(fn, x, compile_fn=compile_fn)
        (out[0].square().sum() + out[1]).backward()
        expect_counts(stats, attempt)
        assert_close(out[0], expected[0], atol=1e-5, rtol=1e-5)
        assert_close(w.grad, expected_grad, atol=1e-4, rtol=1e-4)


def test_batch_norm_running_statistics_and_version_counters(cache_dir, device, compile_fn, assert_close,
                                                            cudnn_without_tf32):
    """A training step writes the running statistics inside the graph: after a hit they match eager's,
    and their version counters moved on (autograd's check for tensors written after being saved)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).to(device)
    eager_model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    for attempt in range(2):
        eager_model.load_state_dict(model.state_dict())
        model.zero_grad()
        eager_model.zero_grad()
        eager_model(x).square().sum().backward()
        mean = model[1].running_mean
        version = mean._version
        out, stats = compiled_step(lambda x: model(x).square().sum(), x, compile_fn=compile_fn)
        out.backward()
        expect_counts(stats, attempt)
        assert mean._version > version
        assert_close(model[1].running_mean, eager_model[1].running_mean, atol=1e-5, rtol=1e-5)
        assert_close(model[1].running_var, eager_model[1].running_var, atol=1e-5, rtol=1e-5)
        for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
            assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


def test_a_non_leaf_input_gets_its_gradient_through_the_hit(cache_dir, device, compile_fn, assert_close):
    """A compiled region in the middle of a model: its input is an intermediate that requires grad,
    and gradients flow through the cached backward to the leaves before it."""
    torch.manual_seed(0)
    a = torch.randn(6, 10, device=device, requires_grad=True)
    w = torch.randn(10, 10, device=device, requires_grad=True)

    def region(h, unused):
        return F.silu(h @ w).sum(-1)
    for attempt in range(2):
        a.grad = w.grad = None
        h = a * 3
        unused = a + 1  # requires grad, gets no gradient from the region: detached, as AOTAutograd does
        out, stats = compiled_step(region, h, unused, compile_fn=compile_fn)
        out.square().sum().backward()
        expect_counts(stats, attempt)
        got = a.grad.clone(), w.grad.clone()
        a.grad = w.grad = None
        region(a * 3, None).square().sum().backward()
        assert_close(got[0], a.grad, atol=1e-4, rtol=1e-4)
        assert_close(got[1], w.grad, atol=1e-4, rtol=1e-4)


def test_autocast_training_step(cache_dir, device, compile_fn, assert_close):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
    x = torch.randn(4, 16, device=device)

    def step(x):
        with torch.autocast(device, dtype=torch.bfloat16):
            return model(x).float().square().mean()
    matches_eager_twice(model, step, x, compile_fn, assert_close, tolerance=2e-2)


def test_a_gradient_in_another_layout_is_given_the_traced_one(cache_dir, device, compile_fn, assert_close):
    """The backward is compiled for its tangents' traced strides: a transposed incoming gradient
    is copied into them, not read as if it had them."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    x = torch.randn(8, 8, device=device)
    grad_out = torch.randn(8, 8, device=device).t()  # not contiguous
    for attempt in range(2):
        w.grad = None
        out, stats = compiled_step(lambda x: torch.tanh(x @ w), x, compile_fn=compile_fn)
        out.backward(grad_out)
        expect_counts(stats, attempt)
        got = w.grad.clone()
        w.grad = None
        torch.tanh(x @ w).backward(grad_out)
        assert_close(got, w.grad, atol=1e-5, rtol=1e-5)


def test_double_backward_raises_after_a_hit(cache_dir, device, compile_fn, assert_close):
    """create_graph=True gives first-order gradients that stay in autograd's graph: using them in a
    loss (a gradient penalty) raises rather than treating them as constants."""
    torch.manual_seed(0)
    w = torch.randn(6, 6, device=device, requires_grad=True)
    x = torch.randn(4, 6, device=device)

    def fn(x):
        return torch.sin(x @ w).sum()
    expected = torch.autograd.grad(fn(x), w)[0]
    for attempt in range(2):
        out, stats = compiled_step(fn, x, compile_fn=compile_fn)
        incoming = torch.ones((), device=device)
        (grad,) = torch.autograd.grad(out, w, grad_outputs=incoming, create_graph=True)
        expect_counts(stats, attempt)
        assert incoming.is_leaf and incoming.grad_fn is None and not incoming.requires_grad
        assert_close(grad, expected, atol=1e-5, rtol=1e-5)
        if attempt == 0 and not grad.requires_grad:
            continue  # AOTAutograd in torch 2.11 hands them back as constants; 2.13 as the hit does
        assert grad.requires_grad
        with pytest.raises(RuntimeError, match="double backward"):
            grad.square().sum().backward()


def test_retain_graph_on_a_backward_that_writes_over_its_activations(cache_dir, device, compile_fn, assert_close):
    """A backward compiled to write over its saved activations, run with retain_graph=True after a
    hit: it is given copies of those, so the second backward reads the values the forward saved."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)).to(device)
    x = torch.randn(32, 16, device=device)
    model(x).sum().backward()
    expected = grads(model)
    model.zero_grad()
    out, stats = compiled_step(lambda x: model(x).sum(), x, compile_fn=compile_fn)
    out.backward()
    expect_counts(stats, 0)
    assert _entry_layout(cache_dir)["donated"], "this graph's backward no longer writes over its activations"
    model.zero_grad()
    out, stats = compiled_step(lambda x: model(x).sum(), x, compile_fn=compile_fn)
    expect_counts(stats, 1)
    out.backward(retain_graph=True)
    out.backward()
    for name, grad in grads(model).items():
        assert_close(grad, 2 * expected[name], atol=1e-4, rtol=1e-4)


def _entry_layout(cache_dir) -> dict:
    import json
    (path,) = sorted((cache_dir / "graphs" / "dynamo").rglob("*.json"))
    return json.loads(path.read_text())["body"]["layout"]


def test_dropout_masks_the_gradient_as_it_masked_the_output(cache_dir, device, compile_fn, assert_close):
    """Random ops run in the cached forward; the backward reads the mask the forward drew."""
    torch.manual_seed(0)
    scale = torch.tensor(1.5, device=device, requires_grad=True)
    x = torch.rand(64, 64, device=device) + 0.5
    for attempt in range(2):
        scale.grad = None
        out, stats = compiled_step(lambda x: F.dropout(x * scale, p=0.5, training=True), x, compile_fn=compile_fn)
        out.sum().backward()
        expect_counts(stats, attempt)
        assert 0.3 < (out == 0).float().mean().item() < 0.7
        assert_close(scale.grad, out.sum() / scale.detach(), atol=1e-3, rtol=1e-4)


def test_symbolic_sizes_save_sizes_for_the_backward(cache_dir, device, compile_fn, assert_close):
    """A graph of symbolic sizes saves sizes for its backward beside its tensors; the hit passes
    them in the order the backward takes them, at sizes other than the traced one."""
    torch.manual_seed(0)
    w = torch.randn(24, 16, device=device, requires_grad=True)

    def fn(x):
        return (torch.softmax(x, -1) @ w).view(-1).square().sum()
    for attempt in range(2):
        x = torch.randn(8, 24, device=device)
        w.grad = None
        out, stats = compiled_step(fn, x, compile_fn=compile_fn, dynamic=True)
        out.backward()
        expect_counts(stats, attempt)
        got = w.grad.clone()
        w.grad = None
        fn(x).backward()
        assert_close(got, w.grad, atol=1e-4, rtol=1e-4)
    compiled = compile_fn(fn, dynamic=True)
    for rows in (3, 11):
        x = torch.randn(rows, 24, device=device)
        w.grad = None
        compiled(x).backward()
        got = w.grad.clone()
        w.grad = None
        fn(x).backward()
        assert_close(got, w.grad, atol=1e-4, rtol=1e-4)


SECOND_PROCESS = textwrap.dedent("""
    import json, sys, torch, torch.nn as nn, smelt
    from smelt import graph_cache
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(sys.argv[1])
    x = torch.randn(8, 16, device=sys.argv[1])
    torch.compile(lambda x: model(x).square().mean(), backend="smelt")(x).backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().mean().backward()
    error = max((g - p.grad).abs().max().item() for g, p in zip(got, model.parameters()))
    print(json.dumps({"stats": dict(graph_cache.stats), "error": error}))
""")


def test_a_second_process_skips_aotautograd_for_a_training_step(cache_dir, device):
    import json
    env = dict(os.environ, SMELT_CACHE_DIR=str(cache_dir), PYTHONPATH=REPO_ROOT)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, device], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["stats"].get("dynamo_stored") == 1, runs[0]
    assert runs[1]["stats"] == {"dynamo_hit": 1}, runs[1]
    assert runs[0]["error"] < 1e-5 and runs[1]["error"] < 1e-5, runs


def test_inputs_sharing_memory_are_part_of_the_key(cache_dir, device, compile_fn, assert_close):
    """Two inputs that overlap are traced as views of one base: an entry stored for separate
    tensors of the same sizes and strides must not serve them (it would read the old values)."""
    def fn(x, a, b):
        a.add_(1)
        return (x * b).sum()

    def inputs(overlap):
        first, second = torch.zeros(8, device=device), torch.zeros(8, device=device)
        return (torch.ones(4, device=device, requires_grad=True), first[0:4], (first if overlap else second)[2:6])
    for overlap in (False, True):
        x, a, b = inputs(overlap)
        out, stats = compiled_step(fn, x, a, b, compile_fn=compile_fn)
        out.backward()
        assert stats.get("dynamo_hit", 0) == 0, dict(stats)
        x_eager, a_eager, b_eager = inputs(overlap)
        expected = fn(x_eager, a_eager, b_eager)
        expected.backward()
        assert_close(out, expected)
        assert_close(x.grad, x_eager.grad)


def test_versions_move_before_the_graph_saves_its_inputs(cache_dir, device, compile_fn, assert_close):
    """An input the graph writes and an input it saves share a version counter (views of one
    base): the writes are counted before the call, so the saved input is not taken for changed."""
    def fn(x, a, b):
        a.add_(1)
        return (x * b).sum()
    for attempt in range(2):
        base = torch.zeros(8, device=device)
        x = torch.ones(4, device=device, requires_grad=True)
        out, stats = compiled_step(fn, x, base[0:4], base[4:8], compile_fn=compile_fn)
        out.backward()
        expect_counts(stats, attempt)
        assert_close(x.grad, torch.zeros(4, device=device))
        assert_close(base, torch.tensor([1.0] * 4 + [0.0] * 4, device=device))


def test_deterministic_algorithms_turned_on_before_the_backward_raise(cache_dir, device, compile_fn):
    torch.manual_seed(0)
    w = torch.randn(4, 4, device=device, requires_grad=True)
    x = torch.randn(2, 4, device=device)

    def fn(x):
        return (x @ w).sin().sum()
    for attempt in range(2):
        out, stats = compiled_step(fn, x, compile_fn=compile_fn)
        if attempt == 0:
            out.backward()  # stores the entry
            continue
        expect_counts(stats, attempt)
        torch.use_deterministic_algorithms(True)
        try:
            with pytest.raises(RuntimeError, match="deterministic"):
                out.backward()
        finally:
            torch.use_deterministic_algorithms(False)


def test_outputs_aliasing_inputs_are_views_of_them_again(cache_dir, device, compile_fn, assert_close):
    """An output that views an input, or is one, is made again from the input after the call, as
    AOTAutograd makes it: it shares the input's memory, writes through it show in the input (a
    buffer the graph itself wrote included), and gradients flow through the view to the input."""
    torch.manual_seed(0)

    def fn(x, w, buffer):
        buffer.add_(1)
        return x.t(), w, (x * w).sum(), buffer.view(-1)
    for attempt in range(2):
        x = torch.randn(3, 4, device=device, requires_grad=True)
        w = torch.randn(3, 4, device=device, requires_grad=True)
        buffer = torch.zeros(2, 2, device=device)
        out, stats = compiled_step(fn, x, w, buffer, compile_fn=compile_fn)
        (out[0].square().sum() + out[1].sum() * 2 + out[2]).backward()
        expect_counts(stats, attempt)
        assert out[1] is w and out[0].data_ptr() == x.data_ptr() and out[0]._base is x
        assert out[3].data_ptr() == buffer.data_ptr()
        assert_close(buffer, torch.ones(2, 2, device=device))
        out[3].add_(1)
        assert_close(buffer, torch.full((2, 2), 2.0, device=device))
        x_eager, w_eager = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        expected = fn(x_eager, w_eager, torch.zeros(2, 2, device=device))
        (expected[0].square().sum() + expected[1].sum() * 2 + expected[2]).backward()
        assert_close(x.grad, x_eager.grad, atol=1e-5, rtol=1e-5)
        assert_close(w.grad, w_eager.grad, atol=1e-5, rtol=1e-5)
        assert [o.requires_grad for o in out] == [o.requires_grad for o in expected]


def test_a_view_of_an_expanded_input_keeps_its_elements_apart(cache_dir, device, compile_fn, assert_close):
    """A view of an input whose elements share memory (expanded) is not made again with as_strided,
    whose gradient would add the elements' gradients together (fuzz seed 3011 with --cache-hits):
    such a graph compiles as before, and its gradients are eager's."""
    def fn(x):
        return x.squeeze(), (x * torch.arange(2.0, device=x.device)).sum()
    for attempt in range(2):
        x = torch.tensor([1.5], device=device).expand(2).requires_grad_()
        out, stats = compiled_step(fn, x, compile_fn=compile_fn)
        (out[0] * torch.tensor([1.0, 3.0], device=device)).sum().add(out[1]).backward()
        assert stats.get("dynamo_hit", 0) == 0, dict(stats)
        assert_close(x.grad, torch.tensor([1.0, 4.0], device=device))


def test_activation_checkpointing_hits(cache_dir, device, compile_fn, assert_close):
    """A checkpointed region is a higher-order op over a subgraph in Dynamo's graph: keyed by the
    subgraph's code, its training step hits and recomputes in the backward as compiled."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
    x = torch.randn(8, 16, device=device)

    def step(x):
        return checkpoint(model, x, use_reentrant=False).square().mean()
    matches_eager_twice(model, step, x, compile_fn, assert_close, tolerance=1e-5)


def test_checkpointing_with_a_context_fn_compiles_as_before(cache_dir, device, compile_fn, assert_close):
    """A checkpoint's context_fn (selective checkpointing) is user code the key cannot show."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    torch.manual_seed(0)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    x = torch.randn(4, 8, device=device)

    def policy_context():
        return create_selective_checkpoint_contexts([torch.ops.aten.mm.default])

    def step(x):
        return checkpoint(lambda y: torch.sin(y @ w), x, use_reentrant=False, context_fn=policy_context).sum()
    expected = torch.autograd.grad(step(x), w)[0]
    for _ in range(2):
        out, stats = compiled_step(step, x, compile_fn=compile_fn)
        assert_close(torch.autograd.grad(out, w)[0], expected, atol=1e-5, rtol=1e-5)
        assert stats.get("dynamo_hit", 0) == 0 and stats.get("dynamo_stored", 0) == 0, dict(stats)
