"""GPU kernels compiled in worker processes before a graph's first call (triton_loading.build_ahead).

Checked on the CPU through SMELT_CHECK_CUDA_COMPILE: each interpreted kernel's CUDA form is compiled
for sm_90 at its first launch with the launch's real argument description. When codegen's guess
of that description (GeneratedKernel.launch_guess) is right, the workers have already kept the
binary and the launch compiles nothing in this process."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F

import smelt
from smelt.runtime import compile_pool, kernel_binaries

pytestmark = [pytest.mark.smelt_only]


def _programs():
    def pointwise_and_rows(x, w, b):
        y = torch.softmax(x @ w, -1).relu() + b
        return y.sum(0), F.layer_norm(y, (y.shape[-1],)), x[1:].cumsum(0)

    def slices_of_one_storage(x, y):
        # cat writes each part into a slice of one buffer: some slices start off 16-byte boundaries.
        return torch.cat([x * 2, y.sin(), x[:, :3] + 1], dim=1).tanh()

    def indices_masks_and_halves(table, idx, mask):
        rows = F.embedding(idx, table).to(torch.bfloat16)
        return torch.where(mask[:, None], rows, 0).float().sum(-1), table.half().amax(0)

    def split_global_sum(x):
        return (x * x).sum(), x.abs().max()

    def dropout(x):
        return F.dropout(x, 0.3, training=True) * 2

    def row_split_softmax(x):  # on the GPU a few long rows are split over programs with a workspace
        return torch.softmax(x, -1)

    return [
        (pointwise_and_rows, (torch.randn(64, 64), torch.randn(64, 64), torch.randn(64))),
        (slices_of_one_storage, (torch.randn(16, 5), torch.randn(16, 3))),
        (indices_masks_and_halves, (torch.randn(50, 24), torch.randint(0, 50, (30,)), torch.rand(30) > 0.5)),
        (split_global_sum, (torch.randn(1 << 17),)),
        (dropout, (torch.randn(1000),)),
        (row_split_softmax, (torch.randn(4, 20000),)),
    ]


@pytest.mark.parametrize("index", range(6), ids=[f.__name__ for f, _ in _programs()])
def test_codegen_guesses_each_launch_so_workers_compile_every_kernel(index, tmp_path, monkeypatch):
    fn, args = _programs()[index]
    compiled_here = []
    compile_binary = kernel_binaries.compile_binary
    monkeypatch.setattr(kernel_binaries, "compile_binary",
                        lambda f, spec, *a, **k: compiled_here.append(spec) or compile_binary(f, spec, *a, **k))
    torch._dynamo.reset()
    with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, graph_cache=True, compile_workers=2,
                               cache_dir=str(tmp_path)):
        actual = torch.compile(fn, backend="smelt")(*args)
    if fn.__name__ != "dropout":
        for a, e in zip(actual, fn(*args)):
            torch.testing.assert_close(a, e)
    assert compiled_here == []  # every CUDA form was found kept: the guesses were the launches


def test_a_worker_starts_warm_for_triton_without_torch():
    worker = compile_pool._Worker()
    try:
        worker.send({"backend": "triton", "warm": True, "name": "warm-up"})
        reply = worker.compile({"backend": "triton", "name": "k", "path": "/nonexistent/k.py", "spec": [],
                                "constexprs": {}, "num_warps": 4, "capability": [9, 0], "options": {},
                                "folder": "/nonexistent/folder"})
    finally:
        worker.close()
    assert reply["ok"] is False and "nonexistent" in reply["error"] and reply["torch_loaded"] is False


def test_batches_submitted_together_share_the_workers_one_job_at_a_time():
    # A training graph's forward batch still compiles when its backward's is submitted (assemble's
    # defer_builds): each worker must take one job at a time, or replies go to the wrong batch.
    def jobs(tag):
        return [{"backend": "triton", "name": f"{tag}{i}", "path": f"/nonexistent/{tag}{i}.py", "spec": [],
                 "constexprs": {}, "num_warps": 4, "capability": [9, 0], "options": {},
                 "folder": f"/nonexistent/{tag}{i}"} for i in range(6)]
    first, second = compile_pool.submit(jobs("a"), 2), compile_pool.submit(jobs("b"), 2)
    for tag, batch in (("b", second), ("a", first)):
        replies = batch.wait()
        assert sorted(r["name"] for r in replies) == [f"{tag}{i}" for i in range(6)]
        assert all(not r["ok"] and f"/nonexistent/{r['name']}" in r["error"] for r in replies)
    assert first.done and second.done


def test_a_training_graph_waits_for_its_builds_at_its_first_call(tmp_path, monkeypatch):
    # The forward's and backward's kernels are still compiling in the workers when each compile
    # returns; each graph's first call waits for them, so no launch compiles in this process.
    from smelt.runtime import assemble
    compiled_here, deferred = [], []
    compile_binary = kernel_binaries.compile_binary
    monkeypatch.setattr(kernel_binaries, "compile_binary",
                        lambda f, spec, *a, **k: compiled_here.append(spec) or compile_binary(f, spec, *a, **k))
    after_builds = assemble._AfterBuilds
    monkeypatch.setattr(assemble, "_AfterBuilds",
                        lambda graph, *rest: deferred.append(graph.kind) or after_builds(graph, *rest))

    def step(x, w, b):
        return (torch.softmax(x @ w, -1).relu() + b).square().mean()

    args = [torch.randn(32, 48, requires_grad=True), torch.randn(48, 48, requires_grad=True),
            torch.randn(48, requires_grad=True)]
    expected = torch.autograd.grad(step(*args), args)
    torch._dynamo.reset()
    with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, graph_cache=True, compile_workers=2,
                               cache_dir=str(tmp_path)):
        loss = torch.compile(step, backend="smelt")(*args)
        actual = torch.autograd.grad(loss, args)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    assert sorted(deferred) == ["backward", "forward"]
    assert compiled_here == []


@pytest.mark.skipif(importlib.util.find_spec("halide") is None, reason="needs Halide (the GPU machine has none)")
@pytest.mark.parametrize("kept", ["retain_graph", "create_graph"])
def test_a_backward_lowered_with_its_forward_runs_twice_over_a_kept_graph(kept, tmp_path, monkeypatch):
    # Lowered before its first backward, the backward writes over activations AOTAutograd donates
    # (Halide's backward does: no workspace holds its buffers); a kept graph's backward gets copies of
    # them, so a second backward reads the values the forward saved (AOTAutograd would refuse the
    # kept graph: its check is smelt's now).
    from smelt import backend
    monkeypatch.setattr(backend, "lowers_backward_with_forward", lambda cfg, cuda: True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1))
    x = torch.randn(32, 16)
    params = list(model.parameters())
    expected = [g * 2 for g in torch.autograd.grad(model(x).sum(), params)]
    torch._dynamo.reset()
    smelt.observe.reset()
    with smelt.config.override(cpu_backend="halide", graph_cache=True, cache_dir=str(tmp_path)):
        loss = torch.compile(model, backend="smelt")(x).sum()
        graphs = {g.kind: g for g in smelt.observe.compiled_graphs()}
        assert "backward" in graphs  # lowered with its forward, before any backward ran
        assert graphs["backward"].copied_when_kept == (3, 5)  # addmm and addmm_1, written over
        first = torch.autograd.grad(loss, params, **{kept: True})
        second = torch.autograd.grad(loss, params)
    for a, b, e in zip(first, second, expected):
        torch.testing.assert_close(a.detach() + b, e)


def test_a_backward_that_fails_to_compile_raises_at_the_first_backward(tmp_path, monkeypatch):
    # Lowered with its forward, the backward's failure must not fail the forward's compile.
    from smelt import backend
    monkeypatch.setattr(backend, "lowers_backward_with_forward", lambda cfg, cuda: True)
    compile_graph = backend.compile_graph

    def failing(gm, example_inputs, kind):
        if kind == "backward":
            raise RuntimeError("no backward today")
        return compile_graph(gm, example_inputs, kind)
    monkeypatch.setattr(backend, "compile_graph", failing)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with smelt.config.override(graph_cache=True, cache_dir=str(tmp_path)):
        out = torch.compile(lambda x: (x @ w).tanh().sum(), backend="smelt")(x)
        torch.testing.assert_close(out, (x @ w).tanh().sum())
        with pytest.raises(RuntimeError, match="no backward today"):
            out.backward()


def test_a_binary_an_earlier_batch_still_builds_is_waited_for_not_built_again(monkeypatch):
    # A backward's kernel its forward has too, or a graph alike another (one per layer): the second
    # graph's build waits for the first's batch instead of compiling the same binary again.
    import threading
    from types import SimpleNamespace
    from smelt.runtime import triton_loading
    submitted, gate = [], threading.Event()

    def held_submit(jobs, workers, after=()):
        submitted.append(sorted(j["folder"] for j in jobs))
        threads = [threading.Thread(target=gate.wait, daemon=True)] if jobs else []
        for t in threads:
            t.start()
        return compile_pool.Batch(threads, [], after)
    monkeypatch.setattr(triton_loading, "submit", held_submit)
    monkeypatch.setattr(triton_loading, "_ahead_jobs", lambda kernel, path, cache_dir: [{"folder": kernel.name}])

    def build(*names):
        kernels = [SimpleNamespace(name=n, combo=None) for n in names]
        return triton_loading.build_ahead(kernels, {n: n for n in names}, "/unused", 2, True, wait=False)
    first = build("a", "b")
    second = build("b", "c")
    only_earlier = build("a")
    assert submitted == [["a", "b"], ["c"], []]
    assert second.after == (first,) and only_earlier.after == (first,) and not only_earlier.threads
    assert not second.done and not only_earlier.done
    gate.set()
    second.wait()
    assert first.done and second.done and only_earlier.done


@pytest.mark.parametrize("ahead", [True, False], ids=["in_workers", "at_the_first_launch"])
def test_triton_keeps_what_it_compiles_for_smelt_in_smelts_cache_folder(ahead, tmp_path, monkeypatch):
    # An empty smelt cache folder must be a cold compile: Triton's own cache of the stages it compiles
    # lives under that folder, not in ~/.triton (the model suite's smelt compile column had read a
    # Triton cache its accuracy check had warmed).
    from smelt.runtime import triton_loading
    elsewhere = tmp_path / "triton_home"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(elsewhere))
    if not ahead:  # no worker jobs: each kernel compiles in this process at its first launch
        monkeypatch.setattr(triton_loading, "_ahead_jobs", lambda *a: [])

    scale = 3.0 if ahead else 5.0  # kernels of their own: the CUDA compile check remembers each source it compiled

    def fn(x):
        return torch.softmax(x * scale, -1).sum(0)

    x = torch.randn(16, 40)
    torch._dynamo.reset()
    with smelt.config.override(cpu_backend="triton", check_cuda_compile=True, graph_cache=True,
                               compile_workers=2, cache_dir=str(tmp_path / "smelt")):
        torch.testing.assert_close(torch.compile(fn, backend="smelt")(x), fn(x))
    entries = [p for p in (tmp_path / "smelt" / "triton").glob("*/*") if p.suffix == ".cubin"]
    assert entries, sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))[:40]
    assert not elsewhere.exists() or not any(elsewhere.rglob("*.cubin"))
