"""Optimizer steps compiled whole: foreach ops lowered per tensor, results equal to eager's."""

import pytest
import torch
from conftest import allocated_shapes, inspects_triton_kernels

SIZES = [(64, 48), (48,), (17, 3), (5,), (1,), (33, 2, 4)]


def _params(device, dtype=torch.float32):
    params = [torch.randn(s, device=device, dtype=dtype, requires_grad=True) for s in SIZES]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _copies(params):
    out = [p.detach().clone().requires_grad_(True) for p in params]
    for p, q in zip(out, params):
        p.grad = q.grad.clone()
    return out


def _adam_pair(shapes, device, foreach=True):
    """(parameters, Adam) to compile and an equal pair for eager; each parameter has a gradient."""
    params = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    ref_params = _copies(params)
    return ((params, torch.optim.Adam(params, lr=1e-2, foreach=foreach)),
            (ref_params, torch.optim.Adam(ref_params, lr=1e-2, foreach=foreach)))


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
    lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True),
], ids=["adam_foreach", "adamw_foreach", "adam_for_loop", "sgd_momentum_foreach"])
def test_steps_match_eager(make, device, compile_fn, assert_close):
    params = _params(device)
    ref_params = _copies(params)
    opt, ref_opt = make(params), make(ref_params)
    step = compile_fn(opt.step, fullgraph=False)
    for _ in range(3):  # the state (moments, step counts) is carried from step to step
        step()
        ref_opt.step()
        for p, q in zip(params, ref_params):
            p.grad.mul_(0.5)
            q.grad.mul_(0.5)
    for p, q in zip(params, ref_params):
        assert_close(p, q, atol=1e-6, rtol=1e-6)
    for state, ref_state in zip(opt.state.values(), ref_opt.state.values()):
        for key in ref_state:
            # A compiled step may keep its step count on the parameters' device (eager: the CPU).
            assert_close(state[key].to(ref_state[key].device), ref_state[key], atol=1e-6, rtol=1e-6)


def test_foreach_ops_lower_to_kernels(device, compile_fn, assert_close, observe):
    xs = [torch.randn(s, device=device) for s in SIZES]
    ys = [torch.randn(s, device=device) for s in SIZES]

    def fn(xs, ys):
        a = torch._foreach_add(xs, ys, alpha=0.5)
        b = torch._foreach_addcmul(a, xs, ys, value=2.0)
        c = torch._foreach_lerp(b, ys, 0.25)
        d = torch._foreach_pow(2.0, [x.abs() for x in c])
        return torch._foreach_maximum(torch._foreach_sqrt([x.abs() for x in d]), 0.5)

    assert_close(compile_fn(fn)(xs, ys), fn(xs, ys))
    (graph,) = observe.compiled_graphs()
    assert not graph.fallback_ops, graph.fallback_ops


MIXED = [(256, 256)] * 3 + [(96,)] * 40 + [(3,)] * 100 + [(5, 7)] * 7  # 150 tensors


def test_adam_over_150_tensors_runs_in_at_most_8_launches(device, compile_fn, assert_close, observe, kernel_count):
    (params, opt), (ref_params, ref_opt) = _adam_pair(MIXED, device)
    compile_fn(opt.step, fullgraph=False)()
    ref_opt.step()
    for p, q in zip(params, ref_params):
        assert_close(p, q, atol=1e-6, rtol=1e-6)
    graphs = observe.compiled_graphs()
    assert not [op for g in graphs for op in g.fallback_ops]
    inspects_triton_kernels()  # combo kernels are Triton's
    assert kernel_count() <= 8, [g.kernel_names for g in graphs]


def test_clipped_adam_step_over_150_tensors_runs_in_at_most_8_launches(device, compile_fn, assert_close, observe,
                                                                       kernel_count):
    # clip_grad_norm_'s per-tensor norms are reductions: the small ones share one combo launch, the
    # big ones' split halves two more, and the total norm and the clipping follow.
    (params, opt), (ref_params, ref_opt) = _adam_pair(MIXED, device)

    def step(params, opt):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    compile_fn(step, fullgraph=False)(params, opt)
    step(ref_params, ref_opt)
    for p, q in zip(params, ref_params):
        assert_close(p, q, atol=1e-6, rtol=1e-6)
    graphs = observe.compiled_graphs()
    assert not [op for g in graphs for op in g.fallback_ops]
    inspects_triton_kernels()
    assert kernel_count() <= 8, [g.kernel_names for g in graphs]


def test_reductions_over_a_list_share_launches(device, compile_fn, assert_close, observe, kernel_count):
    # Row sums, norms and maxima of six shapes: nine kinds (a body at each block size it runs),
    # which two launches of at most eight kinds hold; one launch per tensor without combos.
    xs = [torch.randn(s, device=device) for s in SIZES]

    def fn(xs):
        return [x.sum(-1) for x in xs] + [x.norm() for x in xs] + [x.amax() for x in xs]

    assert_close(compile_fn(fn)(xs), fn(xs))
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    combos = [source for name, source in graph.kernel_sources.items() if "combo" in name]
    assert combos and "rnumel = tl.load(slots" in combos[0], graph.kernel_names
    assert kernel_count() <= 2, graph.kernel_names


def test_a_loop_over_a_list_is_one_launch(device, compile_fn, assert_close, observe, kernel_count):
    # A one-element tensor's kernel indexes by a constant: its body differs, a branch of its own.
    xs = [torch.randn(s, device=device) for s in SIZES]

    def fn(xs):
        return [torch.sigmoid(x) * 3 - x for x in xs]

    assert_close(compile_fn(fn)(xs), fn(xs))
    inspects_triton_kernels()
    assert kernel_count() == 1, [g.kernel_names for g in observe.compiled_graphs()]


def test_kernels_of_different_bodies_and_dtypes_share_one_launch(device, compile_fn, assert_close, observe,
                                                                   kernel_count):
    xs = [torch.randn(s, device=device) for s in SIZES]
    hs = [torch.randn(s, device=device, dtype=torch.float16) for s in SIZES[:3]]

    def fn(xs, hs):
        return [torch.sigmoid(x) * 3 - x for x in xs] + [h.cos() + 1 for h in hs] + [xs[0].exp() * xs[1].sum()]

    assert_close(compile_fn(fn)(xs, hs), fn(xs, hs), atol=2e-3, rtol=2e-3)
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    combos = [source for name, source in graph.kernel_sources.items() if "combo" in name]
    assert len(combos) == 1 and "elif kind == 2:" in combos[0], graph.kernel_names
    # The sum and the kernel that reads it are two more: the last could not join the combo
    # (it reads the sum, which runs after the combo's place).
    assert kernel_count() <= 3, graph.kernel_names


def test_big_kernels_share_a_launch_only_with_their_own_body(device, compile_fn, assert_close, observe):
    # A launch runs all its members at one num_warps and its widest member's registers: a Qwen2
    # norm's row reduction and its weight's column sum ran 90 us together, 65 apart. Kernels of
    # more than combo.SMALL elements share launches with their own body only.
    from smelt.codegen.triton.combo import SMALL
    xs = [torch.randn(SMALL + 1, device=device) for _ in range(4)]

    def fn(a, b, c, d):
        return a.sin() * 2, b.sin() * 2, c.exp() + 1, d.exp() + 1

    assert_close(compile_fn(fn)(*xs), fn(*xs))
    inspects_triton_kernels()
    (graph,) = observe.compiled_graphs()
    combos = [source for name, source in graph.kernel_sources.items() if "combo" in name]
    assert len(combos) == 2 and not any("elif kind == 1:" in c for c in combos), graph.kernel_names


def test_a_combo_body_is_generated_only_for_steps_some_alike_step_is_not_ordered_with(device, compile_fn,
                                                                                       assert_close, observe,
                                                                                       monkeypatch):
    """The same small norm in each of several layers, each reading the last: no two can share a
    launch, so none has its combo body generated (it would be generated again as its own kernel);
    the same norm over independent tensors shares one launch."""
    from smelt.codegen.triton import combo
    inspects_triton_kernels()
    generated = []
    real = combo.ComboBodies._generate
    monkeypatch.setattr(combo.ComboBodies, "_generate", lambda self, step: generated.append(step) or real(self, step))
    weights = [torch.randn(32, 32, device=device) for _ in range(4)]

    def layers(x):
        for w in weights:
            x = torch.nn.functional.layer_norm(x, (32,)) @ w
        return x

    def apart(xs):
        return [torch.nn.functional.layer_norm(x, (32,)) for x in xs]
    x = torch.randn(8, 32, device=device)
    assert_close(compile_fn(layers)(x), layers(x), atol=1e-4, rtol=1e-4)
    assert generated == [] and not any("combo" in n for g in observe.compiled_graphs() for n in g.kernel_names)
    xs = [torch.randn(8, 32, device=device) for _ in range(4)]
    torch._dynamo.reset()
    assert_close(compile_fn(apart)(xs), apart(xs), atol=1e-5, rtol=1e-5)
    assert len(generated) == 4
    assert sum("combo" in n for n in observe.compiled_graphs()[-1].kernel_names) == 1


def test_combo_kernels_off_launches_each_member_alone(device, compile_fn, assert_close, observe):
    import smelt.config
    xs = [torch.randn(s, device=device) for s in SIZES]

    def fn(xs):
        return [torch.sigmoid(x) * 3 - x for x in xs]

    with smelt.config.override(combo_kernels=False):
        assert_close(compile_fn(fn)(xs), fn(xs))
    (graph,) = observe.compiled_graphs()
    assert not any("combo" in name for name in graph.kernel_names), graph.kernel_names
    assert len(graph.kernel_names) == len(SIZES), graph.kernel_names


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for_loop"])
def test_adam_step_counts_and_updates_each_take_one_launch(foreach, device, compile_fn, assert_close, observe,
                                                           kernel_count):
    # The for-loop step alternates: count i += 1, then parameter i, which reads it. Both kinds
    # still gather into one combo each.
    (params, opt), (ref_params, ref_opt) = _adam_pair(MIXED[::5], device, foreach)
    compile_fn(opt.step, fullgraph=False)()
    ref_opt.step()
    for p, q in zip(params, ref_params):
        assert_close(p, q, atol=1e-6, rtol=1e-6)
    inspects_triton_kernels()
    assert kernel_count() <= 4, [g.kernel_names for g in observe.compiled_graphs()]


def test_for_loop_adam_stores_no_per_parameter_scalars(device, compile_fn, observe):
    # Each parameter's bias corrections and lerp weight are one-element values read twice: each
    # kernel recomputes them rather than a buffer per parameter being allocated, written and read.
    params = [torch.randn(s, device=device, requires_grad=True) for s in SIZES]
    for p in params:
        p.grad = torch.randn_like(p)
    compile_fn(torch.optim.Adam(params, lr=1e-2, foreach=False).step, fullgraph=False)()
    sources = [g.wrapper_source for g in observe.compiled_graphs()]
    assert sources and not any(allocated_shapes(s) for s in sources), sources


def test_kernels_that_depend_on_each_other_stay_apart(device, compile_fn, assert_close):
    def fn(a, b, c):
        a.add_(1)  # a later kernel reads the new a: it must not run before this one
        total = b.sum()
        return [a * 2, b + total, c * 2]

    a, b, c = (torch.randn(64, 65, device=device) for _ in range(3))
    expected = fn(*(t.clone() for t in (a, b, c)))
    actual = compile_fn(fn)(a, b, c)
    assert_close(actual, expected)
