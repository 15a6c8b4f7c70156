"""Shared fixtures for the smelt test suite.

Environment knobs:
  SMELT_GRAPH_CACHE   "0" by default here (every graph compiles); "1" reuses cached graphs.
  SMELT_TEST_DEVICE   device the tests run on ("cpu" by default, "cuda" on GPU CI).
  SMELT_TEST_BACKEND  torch.compile backend under test ("smelt" by default).
                      Use "eager" / "aot_eager" to validate the tests themselves;
                      tests that introspect smelt (observe, debug dir, registration)
                      skip in that case.

Fixtures exposed to tests:
  device        -> str, the device to create tensors on
  compile_fn    -> compile_fn(fn, **kw): torch.compile(fn, backend=<backend>, fullgraph=True, **kw)
  assert_close  -> assert_close(actual, expected, atol=None, rtol=None, **kw)
  check         -> check(fn, *args, compile_kw=None, atol=None, rtol=None): compiles fn,
                   runs compiled and eager on the same inputs, compares, returns (actual, expected)
  observe       -> smelt.observe (skips unless the backend is smelt)
  counting_backend -> CompileCounterWithBackend(<backend>) for counting dynamo compilations
  smelt_only    -> marker: @pytest.mark.smelt_only skips unless the backend is smelt
  cpu_backend_independent -> marker: the test's subject sits above the CPU kernel backend (settings,
                   registration, FX passes, memory order, Halide's own tests that pick their backend);
                   deselected when SMELT_TEST_SECOND_BACKEND=1, which `make test` sets on its Triton
                   pass so such tests run once, in the Halide pass.
"""

import os
import threading

from smelt.config import default_cpu_backend  # noqa: E402

# Halide is the CPU default where it can run; `make test` also runs the suite with
# SMELT_CPU_BACKEND=triton (the interpreter), which is how Triton codegen is tested without a GPU.
# Set here, so that subprocesses and the report header name the backend under test.
os.environ.setdefault("SMELT_CPU_BACKEND", default_cpu_backend())
# Tests look at what a compile does (lowerings, fallbacks, log lines), so graphs compile every time;
# tests/test_compile_cache.py turns the graph cache on. SMELT_GRAPH_CACHE=1 runs the suite from the cache.
os.environ.setdefault("SMELT_GRAPH_CACHE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._dynamo.testing  # noqa: E402

DEVICE = os.environ.get("SMELT_TEST_DEVICE", "cpu")
BACKEND = os.environ.get("SMELT_TEST_BACKEND", "smelt")
IS_SMELT = BACKEND == "smelt"

if IS_SMELT:
    import smelt  # noqa: E402,F401  (registers the "smelt" backend)
    import smelt.observe  # noqa: E402,F401
else:
    smelt = None

LOW_PRECISION = (torch.float16, torch.bfloat16)
SMELT_ONLY_REASON = f"introspects smelt internals; backend under test is {BACKEND!r}"


def inspects_triton_kernels() -> None:
    """Called by a test where it starts reading Triton kernel sources or launch settings (block
    sizes, tiles, finishers, hints, autotuning): under another CPU backend the test ends there,
    skipped, after checking what it computed against eager."""
    if DEVICE == "cpu" and os.environ.get("SMELT_CPU_BACKEND", "halide") != "triton":
        pytest.skip(f"inspects Triton kernels; the CPU backend is {os.environ['SMELT_CPU_BACKEND']}")
    if DEVICE.startswith("cuda") and os.environ.get("SMELT_CUDA_BACKEND", "triton") != "triton":
        pytest.skip(f"inspects Triton kernels; the CUDA backend is {os.environ['SMELT_CUDA_BACKEND']}")


def failures_in_threads(work, count: int) -> list[str]:
    """Runs work(k) for k in range(count), each in a thread of its own, all at once; returns each
    thread's exception as text (a thread's exception is otherwise only a pytest warning)."""
    failures: list[str] = []

    def run(k):
        try:
            work(k)
        except Exception as e:
            failures.append(f"thread {k}: {type(e).__name__}: {e}"[:300])
    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def allocated_shapes(wrapper_source: str) -> list[tuple[int, ...]]:
    """The shapes a generated wrapper allocates (torch.empty_strided, or its C++ core), and those of
    the buffers it places in its CPU workspace (scheduler/workspace.py): every buffer it materializes."""
    import re
    found = re.findall(r"^\s*\w+ = (?:torch\.empty_strided|empty_strided_cpu|empty_strided_cuda)\(\(([^)]*)\)", wrapper_source,
                       flags=re.M)
    found += re.findall(r"^    \(\d+, \(([^)]*)\), \([^)]*\), torch\.\w+\),  # \w+$", wrapper_source, flags=re.M)
    return [tuple(int(d) for d in dims.split(",") if d.strip()) for dims in found]


def stops_like_eager_on_the_gpu(setup: str, call: str) -> None:
    """Where eager's CUDA kernel checks an index with a device-side assert, which leaves the
    process's CUDA context unusable: in a process of its own, smelt's compiled `call` (after
    `setup`, which defines its inputs on the GPU and `fn`) must stop the same way, naming the
    index, rather than return."""
    import subprocess
    import sys
    script = (f"import torch, smelt\n{setup}\ncompiled = torch.compile(fn, backend='smelt', fullgraph=True)\n"
              f"out = {call.replace('fn(', 'compiled(')}\ntorch.cuda.synchronize()\nprint('returned', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode != 0 and "returned" not in done.stdout, script
    assert "out of bounds" in done.stderr, done.stderr[-3000:]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "smelt_only: test inspects smelt itself; skipped when SMELT_TEST_BACKEND != smelt"
    )
    config.addinivalue_line(
        "markers", "cpu_backend_independent: the CPU kernel backend does not change what the test checks; "
                   "deselected when SMELT_TEST_SECOND_BACKEND=1"
    )
    config.addinivalue_line(
        "markers", "halide_fallback: a kernel of the test runs in Triton instead of Halide by design (an op "
                   "Halide has no form for); tests/test_halide.py fails any other fallback"
    )
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError("SMELT_TEST_DEVICE=cuda but torch.cuda.is_available() is False")


def pytest_collection_modifyitems(config, items):
    _drop_backend_independent(config, items)
    _keep_shard(config, items)
    if IS_SMELT:
        return
    skip = pytest.mark.skip(reason=SMELT_ONLY_REASON)
    for item in items:
        if "smelt_only" in item.keywords:
            item.add_marker(skip)


def _drop_backend_independent(config, items):
    """`make test` runs the suite once per CPU backend; its second pass sets SMELT_TEST_SECOND_BACKEND=1
    and leaves out what the first pass already checked the same way (CI's time budget)."""
    if os.environ.get("SMELT_TEST_SECOND_BACKEND") != "1":
        return
    dropped = [item for item in items if "cpu_backend_independent" in item.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if "cpu_backend_independent" not in item.keywords]


def _keep_shard(config, items):
    """SMELT_TEST_SHARD=K/N keeps every Nth collected test from the Kth (scripts/gpu_check runs N
    processes so): a file's slow tests spread over the processes instead of holding one of them."""
    shard = os.environ.get("SMELT_TEST_SHARD")
    if not shard:
        return
    k, n = (int(part) for part in shard.split("/"))
    if not 0 <= k < n:
        raise pytest.UsageError(f"SMELT_TEST_SHARD={shard}: wants K/N with 0 <= K < N")
    kept = [item for i, item in enumerate(items) if i % n == k]
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k])
    items[:] = kept


def pytest_report_header(config):
    return f"smelt tests: device={DEVICE} backend={BACKEND} SMELT_CPU_BACKEND={os.environ.get('SMELT_CPU_BACKEND')}"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _default_tols(dtype):
    if dtype in LOW_PRECISION:
        return 1e-2, 1e-2
    if dtype == torch.float32:
        return 1e-5, 1.3e-6  # torch.testing defaults for fp32
    if dtype == torch.float64:
        return 1e-7, 1e-7
    return 0.0, 0.0  # integer / bool: exact


def _assert_close_one(actual, expected, atol, rtol, path, **kw):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a Tensor, got {type(actual).__name__}"
        d_atol, d_rtol = _default_tols(expected.dtype)
        a = d_atol if atol is None else atol
        r = d_rtol if rtol is None else rtol
        if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
            a, r = 0.0, 0.0
        torch.testing.assert_close(
            actual, expected, atol=a, rtol=r, equal_nan=True,
            msg=lambda m: f"{path}: {m}", **kw,
        )
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{path}: expected a sequence, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (x, y) in enumerate(zip(actual, expected)):
            _assert_close_one(x, y, atol, rtol, f"{path}[{i}]", **kw)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{path}: dict keys differ"
        for k in expected:
            _assert_close_one(actual[k], expected[k], atol, rtol, f"{path}[{k!r}]", **kw)
    elif expected is None:
        assert actual is None, f"{path}: expected None, got {type(actual).__name__}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def assert_close(actual, expected, atol=None, rtol=None, **kw):
    """Compare (nested) outputs; tolerance defaults depend on the expected dtype.

    fp32: torch.testing defaults; fp16/bf16: atol=rtol=1e-2; integer/bool: exact.
    Dtype, shape and device must match.
    """
    _assert_close_one(actual, expected, atol, rtol, "output", **kw)


def compile_fn(fn, **kw):
    kw.setdefault("fullgraph", True)
    return torch.compile(fn, backend=BACKEND, **kw)


def _clone_args(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()  # clone keeps strides of dense non-overlapping tensors
            c.requires_grad_(a.requires_grad)
            out.append(c)
        else:
            out.append(a)
    return out


def check(fn, *args, compile_kw=None, atol=None, rtol=None, clone_inputs=False):
    """Run fn eagerly and compiled on the same inputs and compare the outputs."""
    expected = fn(*(_clone_args(args) if clone_inputs else args))
    actual = compile_fn(fn, **(compile_kw or {}))(*args)
    assert_close(actual, expected, atol=atol, rtol=rtol)
    return actual, expected


def dynamo_graph(fn, *args) -> torch.fx.GraphModule:
    """The (first) graph Dynamo captures of fn(*args), before any backend pass."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm
    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*args)
    return graphs[0]


def kernel_count():
    return sum(len(g.kernel_names) for g in smelt.observe.compiled_graphs())


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_compile_state():
    torch._dynamo.reset()
    if IS_SMELT:
        smelt.observe.reset()
    torch.manual_seed(0)
    frozen = torch.backends.flags_frozen()
    yield
    torch._dynamo.reset()
    # A test that imports torch.testing._internal freezes the backends' global flags for every later
    # test in its worker, which then fails or passes by scheduling (CI, fifty-seventh session).
    assert frozen or not torch.backends.flags_frozen(), "this test froze torch.backends' global flags"


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def backend():
    return BACKEND


@pytest.fixture(name="compile_fn")
def compile_fn_fixture():
    return compile_fn


@pytest.fixture(name="assert_close")
def assert_close_fixture():
    return assert_close


@pytest.fixture(name="check")
def check_fixture():
    return check


@pytest.fixture
def observe():
    if not IS_SMELT:
        pytest.skip(SMELT_ONLY_REASON)
    return smelt.observe


@pytest.fixture(name="kernel_count")
def kernel_count_fixture(observe):
    return kernel_count


@pytest.fixture(name="cudnn_without_tf32")
def cudnn_without_tf32_fixture():
    """cuDNN with TF32 off for one test (smelt.tools.accuracy.cudnn_without_tf32: through flags(), which
    works where torch.testing._internal has frozen the global flags)."""
    from smelt.tools.accuracy import cudnn_without_tf32
    with cudnn_without_tf32():
        yield


@pytest.fixture
def counting_backend():
    return torch._dynamo.testing.CompileCounterWithBackend(BACKEND)


def peak_bytes_of_call(fn, device, setup=None) -> int:
    """The most bytes the device's allocator held during one call of `fn`, over what it held before
    (CUDA: max_memory_allocated; CPU: torch.profiler's allocation events, summed in order). With
    `setup`, fn(setup()) is called: on the CPU setup runs under the profiler too, which sees a block
    freed only if it saw it allocated (a forward's saved values, freed by the backward)."""
    if torch.device(device).type == "cuda":
        state = setup() if setup is not None else None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(state) if setup is not None else fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    marker = 123457  # bytes: an allocation of this size marks where fn begins
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        state = setup() if setup is not None else None
        torch.empty(marker, dtype=torch.uint8)
        fn(state) if setup is not None else fn()
    sizes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.typed[1].alloc_size))
        stack.extend(node.children)
    sizes.sort(key=lambda s: s[0])
    first = next(at for at, size in sizes if size == marker)
    current = base = peak = 0
    for at, size in sizes:
        current += size
        if at <= first:
            base = current
        peak = max(peak, current - base)
    return peak


@pytest.fixture
def rewrites(monkeypatch):
    """How many hand-written attention chains each compile rewrote (lowering/handwritten_attention.py)."""
    import smelt.backend
    counts = []
    real = smelt.backend.handwritten_attention_to_sdpa

    def counting(gm, *args):
        counts.append(real(gm, *args))
        return counts[-1]
    monkeypatch.setattr(smelt.backend, "handwritten_attention_to_sdpa", counting)
    return counts
