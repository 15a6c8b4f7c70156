"""The graph cache (smelt.graph_cache): compiled graphs reused by later compiles and processes.

Each test gets its own SMELT_CACHE_DIR. Within one process, `torch._dynamo.reset()` makes Dynamo
hand the same graph to smelt again, which then reads the disk cache as a fresh process would; one
test runs a real second process.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import inspects_triton_kernels

from smelt import graph_cache

pytestmark = pytest.mark.smelt_only

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch, device):
    if device == "cpu" and os.environ.get("SMELT_CPU_BACKEND") == "reference":
        pytest.skip("reference kernels are Python objects: their graphs are never cached")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "smelt_cache"))
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "1")
    monkeypatch.delenv("SMELT_DEBUG_DIR", raising=False)
    graph_cache.stats.clear()
    return tmp_path / "smelt_cache"


def compile_again(fn, *args, compile_fn):
    """Compile `fn` from scratch (Dynamo's in-memory cache cleared) and run it; the hit counts of this compile."""
    torch._dynamo.reset()
    graph_cache.stats.clear()
    out = compile_fn(fn)(*args)
    return out, dict(graph_cache.stats)


def entries(cache_dir, section):
    return sorted((cache_dir / "graphs" / section).rglob("*.json"))


def drop_dynamo_entries(cache_dir):
    """Training steps hit at the Dynamo level (test_training_graph_cache.py); without those entries
    their forward and backward hit at the ATen level, as a graph that does not qualify does."""
    for path in entries(cache_dir, "dynamo"):
        path.unlink()


def softmax(x):
    return torch.softmax(x * 2, dim=-1)


SUBPROCESS_SCRIPT = textwrap.dedent("""
    import json, sys, torch, smelt
    from smelt import graph_cache
    x = torch.linspace(-3, 3, 8 * 24).reshape(8, 24)
    out = torch.compile(lambda x: torch.softmax(x * 2, dim=-1), backend="smelt")(x)
    error = (out - torch.softmax(x * 2, dim=-1)).abs().max().item()
    print(json.dumps({"stats": dict(graph_cache.stats), "error": error,
                      "kernels": [k for g in smelt.observe.compiled_graphs() for k in g.kernel_names]}))
""")


def test_second_process_hits_the_cache(cache_dir, device):
    if device != "cpu":
        pytest.skip("the script builds CPU tensors")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", SUBPROCESS_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["stats"] == {"dynamo_miss": 1, "aten_miss": 1, "dynamo_stored": 1}
    assert second["stats"] == {"dynamo_hit": 1}
    assert first["error"] < 1e-6 and second["error"] < 1e-6
    assert second["kernels"] == first["kernels"] and len(first["kernels"]) == 1


def test_hit_gives_eager_answer_and_is_observable(cache_dir, device, compile_fn, assert_close, observe):
    x = torch.randn(16, 40, device=device)
    first, stats = compile_again(softmax, x, compile_fn=compile_fn)
    assert stats["dynamo_stored"] == 1 and len(entries(cache_dir, "dynamo")) == 1
    observe.reset()
    again, stats = compile_again(softmax, x, compile_fn=compile_fn)
    assert stats == {"dynamo_hit": 1}
    assert_close(again, softmax(x))
    assert not again.requires_grad
    (graph,) = observe.compiled_graphs()
    assert graph.kind == "inference" and graph.cache_key is not None and len(graph.kernel_names) == 1


def test_a_hit_launches_tiled_finished_and_combo_kernels(cache_dir, device, compile_fn, assert_close, monkeypatch,
                                                          observe):
    # Their launch settings (the tile layout, the finisher's ticket, the combo's members) come back from JSON.
    monkeypatch.setenv("SMELT_SPLIT_REDUCTION_MIN_NUMEL", "1000")
    x, y = torch.randn(33, 65, device=device), torch.randn(65, 33, device=device)
    z = torch.randn(5000, device=device)
    u, v = torch.randn(40, device=device), torch.randn(7, 9, device=device)

    def fn(x, y, z, u, v):
        return x.t() + y, z.sum(), [w.cos() * 2 for w in (u, v)]  # the last two: one combo kernel
    compile_again(fn, x, y, z, u, v, compile_fn=compile_fn)
    for _ in range(2):  # the second run reuses the ticket counter the first left at zero
        out, stats = compile_again(fn, x, y, z, u, v, compile_fn=compile_fn)
        assert stats == {"dynamo_hit": 1}
        assert_close(out, fn(x, y, z, u, v), atol=1e-4, rtol=1e-4)
    inspects_triton_kernels()
    names = [n for g in observe.compiled_graphs() for n in g.kernel_names]
    assert any("combo" in n for n in names) and any("tiled" in s for g in observe.compiled_graphs()
                                                    for s in g.kernel_sources.values()), names


@pytest.mark.parametrize("change", ["shape", "dtype", "stride", "setting", "cuda graphs"])
def test_a_changed_input_or_setting_misses(change, cache_dir, device, compile_fn, assert_close, monkeypatch):
    x = torch.randn(16, 40, device=device)
    compile_again(softmax, x, compile_fn=compile_fn)
    if change == "shape":
        x = torch.randn(16, 48, device=device)
    elif change == "dtype":
        x = x.double()
    elif change == "stride":
        x = torch.randn(40, 16, device=device).t()
    elif change == "cuda graphs":
        # Recorded graphs change what is compiled: no buffer reuse over donated inputs, cuDNN's depthwise kernels.
        monkeypatch.setenv("SMELT_CUDA_GRAPHS", "1")
    else:
        monkeypatch.setenv("SMELT_PERSISTENT_REDUCTION_LIMIT", "16")  # rows of 40 now loop
    out, stats = compile_again(softmax, x, compile_fn=compile_fn)
    assert stats.get("dynamo_hit", 0) == 0 and stats.get("aten_hit", 0) == 0, stats
    assert stats["aten_miss"] == 1
    assert_close(out, softmax(x))
    assert len(entries(cache_dir, "aten")) == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit"])
def test_a_damaged_entry_is_ignored_and_rewritten(damage, cache_dir, device, compile_fn, assert_close, caplog):
    x = torch.randn(8, 24, device=device)
    compile_again(softmax, x, compile_fn=compile_fn)
    (aten_entry,) = entries(cache_dir, "aten")
    text = aten_entry.read_text()
    if damage == "truncate":
        aten_entry.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        aten_entry.write_bytes(b"\x00\xff not json")
    else:  # valid JSON whose contents no longer match their hash: a kernel that computes something else
        entry = json.loads(text)
        entry["body"]["wrapper_source"] = entry["body"]["wrapper_source"].replace("return (", "return (0 * ")
        aten_entry.write_text(json.dumps(entry))
    with caplog.at_level(logging.WARNING, logger="smelt.graph_cache"):
        out, stats = compile_again(softmax, x, compile_fn=compile_fn)
    assert_close(out, softmax(x))
    assert any("corrupted graph cache entry" in r.getMessage() and str(aten_entry) in r.getMessage()
               for r in caplog.records), caplog.text
    assert stats.get("dynamo_hit", 0) == 0 and stats["aten_miss"] == 1
    out, stats = compile_again(softmax, x, compile_fn=compile_fn)  # the entry was written again
    assert stats == {"dynamo_hit": 1}
    assert_close(out, softmax(x))


def test_input_mutation_inside_the_graph_is_cached_at_the_dynamo_level(cache_dir, device, compile_fn, assert_close):
    # An optimizer's in-place updates: a later process skips AOTAutograd, and the caller's tensor
    # is still written and its version counter still moves, as AOTAutograd's wrapper does it.
    def fn(x, y):
        x.add_(y)
        return x.sum(dim=-1)

    versions = []
    for attempt in range(3):
        x, y = torch.randn(6, 10, device=device), torch.randn(6, 10, device=device)
        x_eager = x.clone()
        expected = fn(x_eager, y)
        before = x._version
        out, stats = compile_again(fn, x, y, compile_fn=compile_fn)
        versions.append(x._version - before)
        assert_close(out, expected)
        assert_close(x, x_eager)  # the mutation reached the caller's tensor
        assert stats == ({"dynamo_miss": 1, "aten_miss": 1, "dynamo_stored": 1} if attempt == 0 else {"dynamo_hit": 1})
    assert versions[0] >= 1 and versions[1:] == versions[:1] * 2, versions


def test_an_output_aliasing_an_input_is_a_view_of_it_again_on_a_hit(cache_dir, device, compile_fn, assert_close):
    """An inference graph's output that views an input (or is one) is made again from the input, as
    AOTAutograd's wrapper makes it: a view of the caller's tensor, sharing its memory."""
    def fn(x, y):
        return x.view(-1), x.exp(), y

    for attempt in range(2):
        x, y = torch.randn(4, 5, device=device), torch.randn(3, device=device)
        (view, exp, same), stats = compile_again(fn, x, y, compile_fn=compile_fn)
        assert view.data_ptr() == x.data_ptr() and view._base is x and same is y
        view.add_(1)
        assert_close(exp, (x - 1).exp())
        assert stats.get("dynamo_hit" if attempt else "dynamo_stored") == 1, stats


def test_an_output_aliasing_another_output_still_does_on_a_hit(cache_dir, device, compile_fn, assert_close):
    """An inference graph returns a view of its own output as the compiled graph made it (AOTAutograd
    leaves such outputs to the graph): a hit returns them sharing memory as eager's do."""
    def fn(x):
        y = x.exp()
        return y, y.view(-1)

    for attempt in range(2):
        x = torch.randn(4, 5, device=device)
        (y, view), stats = compile_again(fn, x, compile_fn=compile_fn)
        assert view.data_ptr() == y.data_ptr()
        assert_close(y, x.exp())
        assert stats.get("dynamo_hit" if attempt else "dynamo_stored") == 1, stats


def test_training_graphs_hit_at_the_aten_level(cache_dir, device, compile_fn, assert_close):
    def fn(x, w):
        return (F.gelu(x @ w) * 3).sum()

    for attempt in range(2):
        torch.manual_seed(0)
        x = torch.randn(8, 16, device=device)
        w = torch.randn(16, 12, device=device, requires_grad=True)
        w_eager = w.detach().clone().requires_grad_()
        drop_dynamo_entries(cache_dir)
        out, _ = compile_again(fn, x, w, compile_fn=compile_fn)
        out.backward()  # compiles the backward graph
        stats = dict(graph_cache.stats)
        expected = fn(x, w_eager)
        expected.backward()
        assert_close(out, expected, atol=1e-4, rtol=1e-4)
        assert_close(w.grad, w_eager.grad, atol=1e-4, rtol=1e-4)
        assert stats.get("dynamo_hit", 0) == 0
        assert stats.get("aten_hit" if attempt else "aten_miss") == 2, stats  # forward and backward


def test_parameters_under_no_grad_hit_at_the_dynamo_level(cache_dir, device, compile_fn, assert_close):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).to(device)
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        expected = model(x)
        _, stats = compile_again(model, x, compile_fn=compile_fn)
        assert stats["dynamo_stored"] == 1
        out, stats = compile_again(model, x, compile_fn=compile_fn)
    assert stats == {"dynamo_hit": 1}
    assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # With grad on, the same parameters make a training graph: a different key, compiled afresh.
    out, stats = compile_again(model, x, compile_fn=compile_fn)
    assert stats.get("dynamo_hit", 0) == 0 and out.requires_grad


def _dynamic_compile(fn, *args, compile_fn):
    torch._dynamo.reset()
    graph_cache.stats.clear()
    out = compile_fn(fn, dynamic=True)(*args)
    return out, dict(graph_cache.stats)


def test_symbolic_shapes_hit_in_a_later_compile(cache_dir, device, compile_fn, assert_close):
    """A graph of symbolic sizes is keyed by their expressions, the sizes traced and what the shape
    environment knows; the entry then serves other sizes, as the compile did in its own process."""
    x = torch.randn(8, 24, device=device)
    out, stats = _dynamic_compile(softmax, x, compile_fn=compile_fn)
    assert_close(out, softmax(x))
    assert stats == {"dynamo_miss": 1, "aten_miss": 1, "dynamo_stored": 1}, stats
    out, stats = _dynamic_compile(softmax, x, compile_fn=compile_fn)
    assert stats == {"dynamo_hit": 1}, stats
    assert_close(out, softmax(x))
    fn = compile_fn(softmax, dynamic=True)
    fn(x)
    for shape in ((5, 24), (8, 40), (3, 7)):
        y = torch.randn(*shape, device=device)
        assert_close(fn(y), softmax(y))


def test_a_training_graph_of_symbolic_sizes_hits_at_the_aten_level(cache_dir, device, compile_fn, assert_close):
    w = torch.randn(24, 16, device=device, requires_grad=True)

    def f(x):
        return (softmax(x) @ w).square().sum()
    for expected in ("aten_miss", "aten_hit"):
        drop_dynamo_entries(cache_dir)
        torch._dynamo.reset()
        graph_cache.stats.clear()
        x = torch.randn(8, 24, device=device)
        w.grad = None
        compile_fn(f, dynamic=True)(x).backward()
        assert graph_cache.stats[expected] == 2, dict(graph_cache.stats)  # the forward and the backward
        got = w.grad.clone()
        w.grad = None
        f(x).backward()
        assert_close(got, w.grad, atol=1e-4, rtol=1e-4)


def test_symbolic_shapes_traced_at_other_sizes_miss(cache_dir, device, compile_fn, assert_close):
    """Some layouts are judged at the sizes traced: a trace at other sizes compiles afresh."""
    x = torch.randn(8, 24, device=device)
    _dynamic_compile(softmax, x, compile_fn=compile_fn)
    y = torch.randn(6, 30, device=device)
    out, stats = _dynamic_compile(softmax, y, compile_fn=compile_fn)
    assert_close(out, softmax(y))
    assert stats.get("aten_hit", 0) == 0 and stats["aten_miss"] == 1, stats


def test_a_symbols_range_is_part_of_the_key():
    """The shape environment's knowledge of a symbol (its range, the guards on it) decides how
    its index math simplifies: the key holds it."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from smelt.graph_cache.fingerprint import SymbolicFacts, value_text
    texts = []
    for low in (2, 16):
        env = ShapeEnv()
        s = env.create_symintnode(env.create_symbol(32, torch._dynamo.source.ConstantSource("n")), hint=32)
        env.constrain_symbol_range(s.node.expr, compiler_min=low, compiler_max=1024)
        facts = SymbolicFacts()
        texts.append(value_text([s, s * 2], facts) + facts.text())
    assert texts[0] != texts[1] and "@32" in texts[0]


def test_setting_turns_the_cache_off(cache_dir, device, compile_fn, assert_close, monkeypatch):
    monkeypatch.setenv("SMELT_GRAPH_CACHE", "0")
    x = torch.randn(8, 24, device=device)
    for _ in range(2):
        out, stats = compile_again(softmax, x, compile_fn=compile_fn)
        assert stats == {}
        assert_close(out, softmax(x))
    assert not (cache_dir / "graphs").exists()


@torch.library.custom_op("smelt_cache_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@_scaled.register_fake
def _(x, factor):
    return torch.empty_like(x)


def test_a_custom_op_skips_the_dynamo_level(cache_dir, device, compile_fn, assert_close):
    # What a custom op does is not in the graph's code: only the ATen level, which calls it at run time, is kept.
    def fn(x):
        return torch.ops.smelt_cache_test.scaled(x.exp(), 3.0) + 1

    for attempt in range(2):
        x = torch.randn(5, 7, device=device)
        out, stats = compile_again(fn, x, compile_fn=compile_fn)
        assert_close(out, fn(x))
        assert stats["dynamo_uncacheable"] == 1 and stats.get("dynamo_stored", 0) == 0
        assert stats.get("aten_hit" if attempt else "aten_miss") == 1


def test_a_gpu_kernel_variant_is_chosen_by_what_its_code_was_specialized_on():
    from smelt.runtime.cuda_binary import describe
    storage = torch.zeros(64)
    aligned, misaligned = storage[:32], storage[1:33]
    assert describe([aligned, 7]) != describe([misaligned, 7])  # 16-byte alignment
    assert describe([aligned, 7]) != describe([aligned.double(), 7])  # dtype
    assert describe([aligned, 16]) != describe([aligned, 17])  # divisibility by 16
    assert describe([aligned, 7]) != describe([aligned, 2**31])  # a 64-bit integer
    assert describe([aligned, 7]) == describe([storage[32:], 9])  # same specialization, same variant
    assert describe([aligned, True]) is None and describe([aligned, None]) is None  # never passed by smelt


def test_a_damaged_kept_gpu_kernel_is_ignored_and_removed(tmp_path, caplog):
    from smelt.runtime.cuda_binary import CudaBinary
    kept = CudaBinary(name="k", cubin=b"\x7fELF...", num_warps=4, shared=0, arg_kinds=("ptr", "i32"), extra_params=2)
    folder = tmp_path / "kernels" / "ab" / "ab0"
    kept.save(str(folder))
    again = CudaBinary.read(str(folder))
    assert (again.cubin, again.arg_kinds, again.extra_params) == (kept.cubin, kept.arg_kinds, kept.extra_params)
    (folder / "kernel.cubin").write_bytes(b"\x7fELF changed after it was kept")
    with caplog.at_level(logging.WARNING, logger="smelt.runtime"):
        assert CudaBinary.read(str(folder)) is None
    assert "does not match its hash" in caplog.text and not folder.exists()
    folder.mkdir(parents=True)
    (folder / "launch.json").write_text("{not json")
    (folder / "kernel.cubin").write_bytes(b"")
    assert CudaBinary.read(str(folder)) is None and not folder.exists()


def test_adam_step_from_the_dynamo_level_matches_eager(cache_dir, device, assert_close):
    # Issue 6's warm compile: a second process finds the step at the Dynamo level and skips
    # AOTAutograd; the step it runs updates parameters and state as eager's does.
    def make():
        torch.manual_seed(0)
        params = [torch.randn(s, device=device, requires_grad=True) for s in ((64, 32), (32,), (7,))]
        for p in params:
            p.grad = torch.randn_like(p)
        return params, torch.optim.Adam(params, lr=1e-2, foreach=True)

    reference, ref_opt = make()
    for _ in range(3):
        ref_opt.step()
    for attempt in range(2):
        params, opt = make()
        # The step has a graph break (its lazy state set-up): not fullgraph.
        _, stats = compile_again(opt.step, compile_fn=lambda fn: torch.compile(fn, backend="smelt"))
        opt.step()
        opt.step()
        if attempt == 1:
            assert stats.get("dynamo_hit", 0) >= 1 and "aten_miss" not in stats, stats
        for p, q in zip(params, reference):
            assert_close(p, q, atol=1e-6, rtol=1e-6)
        for p, q in zip(params, reference):
            assert_close(opt.state[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"], atol=1e-6, rtol=1e-6)


def _scaled_by_a_constant(scale):
    def fn(x):
        return torch.softmax(x * torch.tensor(scale, device=x.device), dim=-1)  # a tensor constant in the graph
    return fn


def test_small_tensor_constants_are_cached_by_their_bytes(cache_dir, device, compile_fn, assert_close):
    x = torch.randn(4, 3, device=device)
    fn = _scaled_by_a_constant([1.0, 2.0, 3.0])
    out, stats = compile_again(fn, x, compile_fn=compile_fn)
    assert stats.get("aten_miss") == 1 and stats.get("aten_uncacheable", 0) == 0, stats
    out, stats = compile_again(fn, x, compile_fn=compile_fn)
    assert stats.get("dynamo_hit", 0) + stats.get("aten_hit", 0) == 1, stats
    assert_close(out, fn(x))
    # Other bytes in the constant: another key.
    other = _scaled_by_a_constant([3.0, 2.0, 1.0])
    out, stats = compile_again(other, x, compile_fn=compile_fn)
    assert stats.get("aten_miss") == 1, stats
    assert_close(out, other(x))


def test_large_constants_are_not_cached(cache_dir, device, compile_fn, assert_close, monkeypatch):
    from smelt.graph_cache import fingerprint
    monkeypatch.setattr(fingerprint, "MAX_CONSTANT_BYTES", 4)
    x = torch.randn(4, 3, device=device)
    fn = _scaled_by_a_constant([1.0, 2.0, 3.0])
    out, stats = compile_again(fn, x, compile_fn=compile_fn)
    assert stats.get("aten_uncacheable") == 1, stats
    assert_close(out, fn(x))


def test_a_kept_constant_comes_back_with_its_dtype_strides_and_bytes():
    from smelt.artifact import _tensor_from_json, _tensor_to_json
    for t in (torch.randn(3, 4).t(), torch.arange(10)[2:7], torch.tensor(3.5, dtype=torch.bfloat16),
              torch.empty(0, 3), torch.tensor([True, False])):
        back = _tensor_from_json(_tensor_to_json(t))
        assert (back.dtype, back.shape, back.stride(), back.storage_offset()) == \
            (t.dtype, t.shape, t.stride(), t.storage_offset())
        assert torch.equal(back, t)


def test_a_planned_training_step_hits_without_planning_again(cache_dir, device, compile_fn, assert_close,
                                                             monkeypatch, cudnn_without_tf32):
    """Layouts are planned after the cache lookup: a hit reads the forward's reported output strides
    from its entry (the backward is compiled for them) and re-traces nothing."""
    import torch.nn as nn
    import smelt.config
    from smelt import pipeline
    # cuDNN's TF32 convolutions differ between NCHW (eager) and channels-last by 1e-3 (H200, tenth session):
    # the fixture cudnn_without_tf32 turns them off.
    plans = []
    real = pipeline.plan_layouts
    monkeypatch.setattr(pipeline, "plan_layouts", lambda gm, kind, *a: plans.append(kind) or real(gm, kind, *a))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 3, padding=1)).to(device)
    x = torch.randn(2, 3, 8, 8, device=device)
    model(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    for attempt in range(2):
        model.zero_grad()
        plans.clear()
        drop_dynamo_entries(cache_dir)
        torch._dynamo.reset()
        graph_cache.stats.clear()
        with smelt.config.override(channels_last="on"):
            compile_fn(model)(x).square().sum().backward()
        for name, p in model.named_parameters():
            assert_close(p.grad, expected[name], atol=1e-4, rtol=1e-4)
            assert p.grad.stride() == expected[name].stride()
        assert graph_cache.stats.get("aten_hit" if attempt else "aten_miss") == 2, dict(graph_cache.stats)
        assert plans == ([] if attempt else ["forward", "backward"]), plans


def _branching(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a * 2 + b).sin(), lambda a, b: (a - b).cos(), (x, y))


def _branching_otherwise(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a * 2 + b).sin(), lambda a, b: (a - b).tanh(), (x, y))


def test_a_graph_with_torch_cond_hits_at_the_aten_level_with_its_branches(cache_dir, device, compile_fn, assert_close):
    """torch.cond's branches are subgraphs of the ATen graph: keyed by their own text, written out by
    name and compiled again (from the cache) when the graph is read back. The Dynamo graph holds the
    branches as modules, so AOTAutograd still traces it."""
    x, y = torch.randn(8, 8, device=device).abs(), torch.randn(8, 8, device=device)
    out, stats = compile_again(_branching, x, y, compile_fn=compile_fn)
    assert stats.get("aten_miss") == 3 and stats.get("aten_uncacheable", 0) == 0, stats  # the graph and its branches
    for sign in (1, -1):  # both branches run from the cache
        out, stats = compile_again(_branching, sign * x, y, compile_fn=compile_fn)
        assert stats.get("aten_hit") == 3 and stats.get("aten_miss", 0) == 0, stats
        assert_close(out, _branching(sign * x, y))
    # Another branch body: another key for the graph holding it.
    out, stats = compile_again(_branching_otherwise, -x, y, compile_fn=compile_fn)
    assert stats.get("aten_miss", 0) >= 1, stats
    assert_close(out, _branching_otherwise(-x, y))


def test_a_training_graph_with_torch_cond_hits_with_its_branches(cache_dir, device, compile_fn, assert_close):
    """The forward and the backward each hold the cond's two branches: six graphs, all read back."""
    def loss(x, w):
        return torch.cond(x.sum() > 0, lambda a, b: (a @ b).sin(), lambda a, b: (a - b).cos(), (x, w)).sum()
    x = torch.randn(8, 8, device=device)
    for expected in ({"aten_miss": 6}, {"aten_hit": 6}):
        w = torch.randn(8, 8, device=device, requires_grad=True)
        torch._dynamo.reset()
        graph_cache.stats.clear()
        compile_fn(loss)(x, w).backward()
        got, w.grad = w.grad, None
        loss(x, w).backward()
        assert_close(got, w.grad)
        assert {k: v for k, v in graph_cache.stats.items() if k.startswith("aten")} == expected, dict(graph_cache.stats)


def test_a_graph_compiled_under_autocast_hits_at_the_dynamo_level_and_runs_as_compiled(cache_dir, device,
                                                                                        compile_fn, assert_close):
    # AOTAutograd's wrapper turns autocast off around a graph traced under it (its casts are in the
    # graph): a hit must too, or a float32 product the model asked for (autocast off around it)
    # would be cast to bfloat16. The autocast state is in the key: without autocast it compiles afresh.
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 32).to(device)
    w = torch.randn(32, 8, device=device)

    def fn(x):
        a = F.gelu(lin(x))
        with torch.autocast(device, enabled=False):
            return a.float() @ w, a

    x = torch.randn(4, 16, device=device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        expected = fn(x)
        first, stats = compile_again(fn, x, compile_fn=compile_fn)
        assert stats["dynamo_stored"] == 1, stats
        again, stats = compile_again(fn, x, compile_fn=compile_fn)
    assert stats == {"dynamo_hit": 1}
    assert again[0].dtype == torch.float32 and again[1].dtype == expected[1].dtype == torch.bfloat16
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    assert_close(again[0], expected[0], atol=1e-2, rtol=1e-2)
    with torch.no_grad():
        plain, stats = compile_again(fn, x, compile_fn=compile_fn)
    assert stats.get("dynamo_hit", 0) == 0 and plain[1].dtype == torch.float32
