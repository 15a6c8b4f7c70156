"""Timings of one (model, mode) case for eager, Inductor and smelt: the cold first call (compile
included: the CLI turns both compilers' on-disk caches off), then the steady time per call
(median of triton.testing.do_bench on CUDA, median of N calls on the CPU) and the peak memory
of a call (CUDA only).

The default-mode backends' steady times are taken in ROUNDS, each backend once a round in turn, and
each figure is the best of its rounds. The GPU machine's host runs in phases of some seconds at
about 1.6x different speeds (2026-11-30: Swin's host time per call stepped 3.3 -> 2.1 ms in one
process, Inductor's 3.0 -> 4.8 -> 3.0), and a host-bound row measured alone read whichever phase it
fell in; turns of about a tenth of a second put every backend under the same phases."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import os
import statistics
import sys
import tempfile
import time

import torch

from .cache_tensors import cache_kwargs, cache_of
from .modes import DYNAMIC_SEQS
from .spec import autocast_for, build_model, seeded

BACKENDS = ("eager", "inductor", "smelt")
# With CUDA graphs: both compilers again, in torch.compile's mode="reduce-overhead".
GRAPHED = ("inductor-ro", "smelt-ro")
ROUNDS = 7
# A file that suite processes sharing one GPU lock while they time (scripts/model_suite_shards):
# their compiles overlap, their timed turns do not.
TIMING_LOCK_ENV = "SMELT_SUITE_TIMING_LOCK"


@contextlib.contextmanager
def timed_alone():
    """Held while steady times are taken: with SMELT_SUITE_TIMING_LOCK set, no other suite process
    sharing that file times at once (each waits for the file's lock); otherwise nothing."""
    path = os.environ.get(TIMING_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def progress(line: str) -> None:
    """A case's phases on stderr as they end: a run stopped by a time limit still says where its
    time went (a row that never finished said nothing)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _steady_ms(fn, device, cpu_calls: int) -> float:
    if torch.device(device).type == "cuda":
        import triton.testing
        return triton.testing.do_bench(fn, return_mode="median")
    fn()
    times = []
    for _ in range(cpu_calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _mode_settings(backend: str, compile_mode: str) -> dict:
    if backend != "smelt":
        raise ValueError(f"model suite: {backend} is compiled with mode {compile_mode!r} or with options, not both")
    from smelt.backend import MODES
    return MODES[compile_mode]


def case_callable(spec, mode, size, device, seed, backend, compile_mode=None, options=None):
    """A no-argument function running one call of the case, compiled with `backend` (None: eager)
    under torch.compile's `mode` and `options`."""
    def compiled(fn, **kw):
        if options and compile_mode is not None:  # torch.compile takes one or the other
            kw["options"] = {**_mode_settings(backend, compile_mode), **options}
        elif compile_mode is not None:
            kw["mode"] = compile_mode
        elif options:
            kw["options"] = options
        return fn if backend is None else torch.compile(fn, backend=backend, **kw)

    dtype = torch.bfloat16 if mode == "infer_bf16" else torch.float32
    model = build_model(spec, size, seed).to(device=device, dtype=dtype)
    if mode == "train":
        model.train()
        sample = spec.sample(size, generator=seeded(seed)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        loss_fn, step = compiled(functools.partial(spec.loss, model)), compiled(opt.step)

        def train_step():
            if compile_mode is not None:  # Inductor's graph trees: a new step, the last one's outputs are done
                torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            with autocast_for(device):
                loss = loss_fn(sample)
            loss.backward()
            step()
        return train_step
    model.eval()
    if mode == "decode":
        prompt = spec.sample(size, generator=seeded(seed)).to(device)
        with torch.no_grad():
            out = model(**dict(prompt.kwargs, use_cache=True))
        cache, next_ids = cache_of(out), out.logits[:, -1:].argmax(-1)
        length = cache.get_seq_length()
        forward = compiled(model)

        def decode_step():
            with torch.no_grad():
                forward(input_ids=next_ids, **cache_kwargs(model, cache))
            try:
                cache.crop(-1)  # transformers 5: drop the token just appended
            except ValueError:
                cache.crop(length)
        return decode_step
    seq = DYNAMIC_SEQS[size][-1] if mode == "dynamic" else None
    sample = spec.sample(size, seq_len=seq, generator=seeded(seed)).to(device, float_dtype=dtype)
    forward = compiled(model, **({"dynamic": True} if mode == "dynamic" else {}))
    # dynamic: the first call compiles at another length first, as a served model's graph would be
    # (inside the first call, so that the compile's seconds count both).
    first = [spec.sample(size, seq_len=DYNAMIC_SEQS[size][0], generator=seeded(seed)).to(
        device, float_dtype=dtype)] if mode == "dynamic" else []

    def infer():
        with torch.no_grad():
            if first:
                forward(**first.pop().kwargs)
            forward(**sample.kwargs)
    return infer


def measure_case(spec, mode, size, device, seed=0, inductor=True, cpu_calls=15, cuda_graphs=False,
                 graphs_only=False) -> dict:
    # peak_reserved: the caching allocator's reserved bytes, which CUDA graphs are compared by (a
    # recording's memory is the pool's; Inductor's replays hand out outputs the allocator does not count).
    # Kept for eager and the graphed rows only: the default-mode rows are built beside earlier ones'
    # live tensors, whose segments' free space they can take without reserving more.
    result = {"ms": {}, "compile_s": {}, "peak_bytes": {}, "peak_reserved": {}}
    with tempfile.TemporaryDirectory(prefix="smelt-suite-") as folders, _recompiles_counted():
        _measure(spec, mode, size, device, seed, inductor, cpu_calls, cuda_graphs, graphs_only, result, folders)
    return result


def _recompiles_counted():
    """Dynamo's recompile limit counts every compile of a code object, whichever backend made it,
    and past it runs the frame eagerly: the backends alive together get room, and a hit raises
    rather than time eager under a compiler's name."""
    limits = {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}
    return torch._dynamo.config.patch(**{k: v for k, v in limits.items() if hasattr(torch._dynamo.config, k)})


def _fresh_code_state() -> None:
    """Forget which sizes Dynamo saw change (its automatic-dynamic record is per code object, not per
    backend): each backend's first compile is then the one it would make alone."""
    pgo = getattr(torch._dynamo, "pgo", None)
    if pgo is not None and hasattr(pgo, "reset_code_state"):
        pgo.reset_code_state()


def _measure(spec, mode, size, device, seed, inductor, cpu_calls, cuda_graphs, graphs_only, result, folders) -> None:
    cuda = torch.device(device).type == "cuda"
    graphed_rows = GRAPHED if cuda_graphs and cuda else ()
    names = (("eager",) if graphs_only and graphed_rows else BACKENDS) + graphed_rows
    steady = {}  # the default-mode backends' calls, kept for the rounds
    torch._dynamo.reset()
    for name in names:
        if name.startswith("inductor") and not inductor:
            continue
        graphed = name.endswith("-ro")
        if graphed and steady:  # graphed rows are GPU-bound: timed alone, after the rounds
            fn = None
            _rounds(steady, device, cpu_calls, result, f"{spec.name} {mode}")
            steady.clear()
            torch._dynamo.reset()
        # The last backend's model and compiled graphs, freed now rather than by a collection in the
        # middle of this one's measurement (Inductor's reduce-overhead row measured -66 MiB so).
        gc.collect()
        if cuda and hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            # Each backend pays for the cuBLAS workspaces its streams need: Inductor's graphs clear
            # the earlier rows' (its reduce-overhead row measured -66 MiB against its base so).
            torch._C._cuda_clearCublasWorkspaces()
        _fresh_code_state()
        backend = None if name == "eager" else name.removesuffix("-ro")
        # smelt's row compiles as a user's first compile does (kernels compiled by its workers into
        # the cache folder, which they need to be kept in), from an empty folder of its own: the
        # accuracy check compiled this case already. (The CLI's SMELT_GRAPH_CACHE=0 alone left
        # every kernel to Triton's JIT in this process, one after another.)
        options = {"graph_cache": True, "cache_dir": os.path.join(folders, name)} if backend == "smelt" else None
        fn = case_callable(spec, mode, size, device, seed, backend,
                           "reduce-overhead" if graphed else None, options)
        _sync(device)
        if cuda:
            torch.cuda.empty_cache()
            base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if graphed:  # the second call records the graphs
            fn()
            _sync(device)
        if name != "eager":
            result["compile_s"][name] = time.perf_counter() - t0
        progress(f"{spec.name} {mode}: {name}'s first call{'s' if graphed else ''} {time.perf_counter() - t0:.1f} s")
        if cuda:
            # A steady call's peak: graphs settle over a few calls (those recorded out of order are
            # recorded again), and what their recordings keep counts from before the first call.
            for _ in range(2 if graphed else 0):
                fn()
            _sync(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            if not graphed:
                base = torch.cuda.memory_allocated()
            fn()
            _sync(device)
            result["peak_bytes"][name] = torch.cuda.max_memory_allocated() - base
            if graphed or not steady:
                result["peak_reserved"][name] = torch.cuda.max_memory_reserved() - base_reserved
        if not graphed:
            # Kept for the rounds: the backends' models stay alive together, their Dynamo cache entries
            # on the same code objects (told apart by backend before any guard runs).
            steady[name] = fn
            continue
        with timed_alone():
            result["ms"][name] = _steady_ms(fn, device, cpu_calls)
        del fn
        if cuda:
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    if steady:
        _rounds(steady, device, cpu_calls, result, f"{spec.name} {mode}")
    steady.clear()
    torch._dynamo.reset()


def _rounds(steady: dict, device, cpu_calls: int, result: dict, case: str) -> None:
    """Each backend's steady ms a call, the best of ROUNDS turns in which the backends take turns
    (the order rotates, so none always follows another); each turn's figure is kept too."""
    names = list(steady)
    turns = {name: [] for name in names}
    calls = max(3, cpu_calls // 3)  # CPU turns: fewer calls each, more turns than one long run
    with timed_alone():
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                turns[name].append(_steady_ms(steady[name], device, calls))
    for name in names:
        # The best turn: the backend's time in the host's fast phase, which every backend meets in
        # some of its turns; a median read whichever phase most turns fell in (ResNet-50's smelt turns
        # 1.95-3.81 ms on the H200, the same code).
        result["ms"][name] = min(turns[name])
        result.setdefault("ms_turns", {})[name] = turns[name]
    progress(f"{case}: timed " + ", ".join(f"{name} {result['ms'][name]:.2f} ms" for name in names))
