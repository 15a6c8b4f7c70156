"""Peak memory of one call on the CPU, eager against smelt, and what is alive at each one's peak.

The CPU has no `max_memory_allocated`, so two counts stand in for it:

- the peak, from torch.profiler's allocation events (`profile_memory=True`): every allocation
  and free of torch's CPU allocator during the call, with its size, summed in order. This is
  what `max_memory_allocated() - memory_allocated()` measures on CUDA: ATen kernels' own scratch
  included, Halide's internal buffers (its own malloc) not. Dynamo runs compiled code under it.
- what is alive at the peak, by name: a TorchDispatchMode sees every ATen op's results; a result whose storage is none of the op's
tensor arguments' (a new allocation, not a view or an in-place write) is counted by its bytes until
its storage dies (`weakref.finalize` on the storage object, which torch keeps alive exactly as
long as the storage). smelt's wrappers allocate their kernels' buffers with
`torch._C._dynamo.guards._empty_strided_cpu`, which does not pass through the dispatcher: for the
measured call each compiled graph's wrapper gets a `torch.empty_strided` in its place (the same
allocation, seen by the mode), and each allocation is named by the wrapper line that made it.
Storages that exist before the call (weights, inputs) are not counted. Dynamo does not run
compiled code under an active dispatch mode (it runs the function eagerly instead), so for smelt the
mode is entered inside each compiled graph's call only (what runs between graphs is not seen: the
profiler's peak is the one to compare; the probe turns the graph cache off, whose graphs are
called around the CompiledGraph). Scratch an ATen kernel allocates inside itself is not
seen either (the profiler's peak has it).

    python -m benchmarks.probes.cpu_peak_memory --check            # the toy functions
    python -m benchmarks.probes.cpu_peak_memory --models bert,gpt2 --batch 2 --seq 128 --dtype fp32

`--no-reuse` compiles without in-place reuse (scheduler/reuse.py): RESULTS' ResNet-50 pair is
`--models resnet50` with and without it. `--size real` builds the suite's real configs (BERT-base, GPT-2) at `--batch` x `--seq` tokens;
`--top N` lists the N largest storages alive at each side's peak. `--mode train` measures a training
step (forward, backward, AdamW); `benchmarks/probes/train_phase_memory.py` compares it with Inductor's
phase by phase. `--debug-dir` keeps smelt's
wrappers (SMELT_DEBUG_DIR).
"""
from __future__ import annotations

import argparse
import os
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages allocated under the mode and still alive; the peak and what made it."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[int, str]] = {}  # data_ptr -> (bytes, what allocated it)
        self.current = 0
        self.peak = 0
        self.at_peak: dict[int, tuple[int, str]] = {}
        self.allocations = 0

    def track(self, tensor: torch.Tensor, what: str) -> None:
        storage = tensor.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0 or ptr in self.live:
            return
        self.live[ptr] = (nbytes, what)
        self.current += nbytes
        self.allocations += 1
        weakref.finalize(storage, self._free, ptr)
        if self.current > self.peak:
            self.peak = self.current
            self.at_peak = dict(self.live)

    def _free(self, ptr: int) -> None:
        entry = self.live.pop(ptr, None)
        if entry is not None:
            self.current -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.track(t, _describe(func, t))
        return out

    def largest_at_peak(self, n: int) -> list[tuple[int, str]]:
        return sorted(self.at_peak.values(), key=lambda e: -e[0])[:n]


def _describe(func, t: torch.Tensor) -> str:
    return f"{func} -> {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} at {_caller()}"


def _caller() -> str:
    """The smelt wrapper line, else the first frame outside torch, that made the allocation."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if os.path.basename(path).startswith("wrapper_"):
            return f"{os.path.basename(path)}:{frame.f_lineno} {_line(path, frame.f_lineno)}"
        if fallback is None and f"{os.sep}torch{os.sep}" not in path and "cpu_peak_memory" not in path \
                and "_python_dispatch" not in path:
            fallback = f"{os.path.basename(path)}:{frame.f_lineno} {_line(path, frame.f_lineno)}"
        frame = frame.f_back
    return fallback or "?"


def _line(path: str, lineno: int) -> str:
    import linecache
    text = linecache.getline(path, lineno).strip()
    return text[:90]


def _dispatched_empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def route_smelt_allocations() -> int:
    """Every compiled smelt graph's wrapper allocates through the dispatcher from now on; returns
    how many wrappers were changed."""
    import smelt.observe
    changed = 0
    for graph in smelt.observe.compiled_graphs():
        call = graph.call
        namespace = getattr(getattr(call, "call", call), "__globals__", None)
        if namespace is not None and "empty_strided_cpu" in namespace:
            namespace["empty_strided_cpu"] = _dispatched_empty_strided_cpu
            changed += 1
    return changed


def count_inside_graphs(counter: LiveStorages) -> int:
    """Every compiled smelt graph runs its call under `counter` (and allocates through the
    dispatcher); returns how many graphs."""
    import smelt.observe
    route_smelt_allocations()
    graphs = smelt.observe.compiled_graphs()
    for graph in graphs:
        inner = getattr(graph, "_unmeasured_call", graph.call)
        graph._unmeasured_call = inner

        def measured(args, inner=inner):
            with counter:
                return inner(args)
        graph.call = measured
    return len(graphs)


def stop_counting_inside_graphs() -> None:
    import smelt.observe
    for graph in smelt.observe.compiled_graphs():
        if hasattr(graph, "_unmeasured_call"):
            graph.call = graph._unmeasured_call
            del graph._unmeasured_call


def profiled_peak(fn) -> int:
    """Bytes torch's CPU allocator held at most during one call of `fn`, over what it held before."""
    return allocations_of(fn)[1]


def allocation_events(prof) -> list[tuple]:
    """(time ns, bytes, pointer, profiler node) of every allocation (bytes > 0) and free (< 0) a
    torch.profiler session with profile_memory=True recorded, in time order."""
    from torch._C._profiler import _EventType
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation:
            events.append((node.start_time_ns, node.typed[1].alloc_size, node.typed[1].ptr, node))
        stack.extend(node.children)
    return sorted(events, key=lambda e: (e[0], e[1]))


def allocations_of(fn) -> tuple:
    """(fn's result, the allocator's peak over its level before the call, bytes left allocated),
    from torch.profiler's allocation events. Frees of memory allocated before the call are not
    among them (the profiler drops them)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    current = peak = 0
    for _, size, _, _ in allocation_events(prof):
        current += size
        peak = max(peak, current)
    return out, peak, current


def peak_of(fn, compiled: bool = False) -> LiveStorages:
    """Counts one call of `fn` (already warmed: compiled graphs exist): `compiled`, inside smelt's
    graphs only (Dynamo would run `fn` eagerly under the mode)."""
    counter = LiveStorages()
    if compiled:
        count_inside_graphs(counter)
        try:
            fn()
        finally:
            stop_counting_inside_graphs()
    else:
        with counter:
            fn()
    counter.profiled = profiled_peak(fn)
    return counter


# ---------------------------------------------------------------- checks on known answers
def check() -> None:
    n = 1 << 20  # float32: 4 MiB a tensor

    def chain(x):
        a = x * 2        # +4
        b = a + 1        # +4 (8)
        del a            # -4
        c = b.exp()      # +4 (8)
        d = c.view(-1)   # a view: nothing
        c.add_(1)        # in place: nothing
        return d.sum()   # +4 bytes

    def three_alive(x):
        a, b, c = x + 1, x + 2, x + 3  # 12 MiB alive at once
        return (a + b + c).sum()       # a + b: +4 (16 MiB), then + c: +4 while a + b is alive (20), a+b freed

    x = torch.randn(n)
    mib = 1 << 20
    for fn, expected in ((chain, 8 * mib), (three_alive, 20 * mib)):
        counted = peak_of(lambda: fn(x))
        got = counted.peak
        print(f"{fn.__name__}: peak {got / mib:.3f} MiB (profiler {counted.profiled / mib:.3f}), "
              f"expected {expected / mib:.3f} MiB")
        assert abs(got - expected) <= 64 and abs(counted.profiled - expected) <= 64, (got, counted.profiled, expected)

    import smelt  # noqa: F401
    torch._dynamo.reset()
    compiled = torch.compile(three_alive, backend="smelt")
    compiled(x)
    counter = peak_of(lambda: compiled(x), compiled=True)
    print(f"three_alive under smelt: peak {counter.peak} bytes (profiler {counter.profiled}; "
          f"{counter.allocations} allocations seen; one fused kernel reads x once: a few bytes)")
    for size, what in counter.largest_at_peak(4):
        print(f"    {size:9d} B  {what}")
    assert counter.allocations >= 1, "the smelt wrapper's allocation was not seen"
    assert counter.peak < 4096 and counter.profiled < 4096

    def materialized(x):  # a matmul's result and a kernel's: 4 MiB each
        y = (x.view(1024, 1024) @ x.view(1024, 1024)).relu()
        return y * y.sum()

    torch._dynamo.reset()
    compiled = torch.compile(materialized, backend="smelt")
    compiled(x)
    eager, smelt_side = peak_of(lambda: materialized(x)), peak_of(lambda: compiled(x), compiled=True)
    print(f"mm + relu + scale: eager {eager.peak / mib:.3f} MiB (profiler {eager.profiled / mib:.3f}), "
          f"smelt {smelt_side.peak / mib:.3f} MiB (profiler {smelt_side.profiled / mib:.3f})")
    for size, what in smelt_side.largest_at_peak(4):
        print(f"    {size / mib:9.3f} MiB  {what}")
    assert eager.peak >= 8 * mib and smelt_side.peak >= 8 * mib  # the product and its result, each side
    print("checks pass")


# ---------------------------------------------------------------- the model suite
def model_case(name: str, size: str, batch: int, seq: int, dtype: str, backend, mode: str = "infer"):
    from smelt.tools.model_suite import zoo_text
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[name]
    zoo_text.BATCH[size], zoo_text.SEQ[size] = batch, seq  # the sample's batch and length
    if mode == "train":  # a training step: forward, backward and AdamW (float32: the suite has no CPU autocast)
        return case_callable(spec, "train", size, "cpu", 0, backend)
    return case_callable(spec, "infer_bf16" if dtype == "bf16" else "infer_fp32", size, "cpu", 0, backend)


def measure_model(name, size, batch, seq, dtype, top, mode="infer") -> dict:
    import smelt  # noqa: F401
    import smelt.observe
    result = {}
    for backend in (None, "smelt"):
        torch._dynamo.reset()
        smelt.observe.reset()
        fn = model_case(name, size, batch, seq, dtype, backend, mode)
        fn()
        fn()
        label = backend or "eager"
        if backend is not None:
            planned = [g.planned_peak_bytes for g in smelt.observe.compiled_graphs()]
        counter = peak_of(fn, compiled=backend is not None)
        result[label] = counter.profiled
        print(f"{name} {dtype} batch {batch} seq {seq}, {label}: peak {counter.profiled / 2**20:.1f} MiB "
              f"(profiler); live storages seen: peak {counter.peak / 2**20:.1f} MiB, {counter.allocations} allocations"
              + (f"; graphs: {len(planned)}, PLANNED_PEAK_BYTES {[round(p / 2**20, 1) if p else p for p in planned]} MiB"
                 if backend else ""), flush=True)
        for nbytes, what in counter.largest_at_peak(top):
            print(f"    {nbytes / 2**20:9.2f} MiB  {what}")
        del fn
    print(f"{name}: smelt / eager = {result['smelt'] / result['eager']:.3f}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--models", default="bert,gpt2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--debug-dir", default=None)
    parser.add_argument("--mode", default="infer", choices=("infer", "train"),
                        help="train: one training step (forward, backward, AdamW), in float32")
    parser.add_argument("--no-reuse", action="store_true",
                        help="compile without in-place reuse (scheduler/reuse.py), for a before/after pair")
    args = parser.parse_args()
    if args.no_reuse:
        import smelt.pipeline
        smelt.pipeline.plan_reuse = lambda *a: {}
    if args.debug_dir:
        os.environ["SMELT_DEBUG_DIR"] = args.debug_dir
    # A graph from the Dynamo-level cache is called through its wrapper's `call` itself, not
    # through the CompiledGraph that count_inside_graphs patches.
    os.environ["SMELT_GRAPH_CACHE"] = "0"
    torch.manual_seed(0)
    if args.check:
        check()
        return
    for name in args.models.split(","):
        measure_model(name, args.size, args.batch, args.seq, args.dtype, args.top, args.mode)


if __name__ == "__main__":
    main()
