"""What a compile report holds, gathered while a program runs under smelt.

Inside `capture()`: every graph smelt compiles (observe's record) has its kernels wrapped to count
their calls and the bytes of their tensor arguments (each read or written once: the bytes a kernel
moves at least); torch.profiler times them (a CPU kernel is recorded under its name by its
launcher, a CUDA kernel is the Triton function of that name) and the ATen ops; Dynamo's counters
give the graph breaks and their reasons. On leaving, the kernels are unwrapped and the copy
bandwidth of each device is measured, to put each kernel against it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
import resource
import time

import torch

from .. import observe

_ORIGINS = re.compile(r"^# (\w+): (.*)$", re.M)


@dataclasses.dataclass
class KernelStats:
    calls: int = 0
    bytes: int = 0  # summed over calls
    host_seconds: float = 0.0  # around each call: a CPU kernel's time where the profiler has none


@dataclasses.dataclass
class KernelRow:
    name: str
    graph: int
    origins: str
    source: str
    path: str
    calls: int
    bytes_per_call: float
    seconds: float  # measured, all calls
    bandwidth_share: float | None  # bytes / time against the device's copy bandwidth


@dataclasses.dataclass
class GraphRow:
    number: int
    kind: str
    kernels: list[str]
    fallback_ops: list[str]
    stage_seconds: dict
    wrapper_source: str
    wrapper_path: str
    planned_peak_bytes: int | None = None  # the wrapper's own buffers alive at once, at most


@dataclasses.dataclass
class Report:
    title: str
    device: str
    seconds: float  # wall time of the captured block
    graphs: list[GraphRow]
    kernels: list[KernelRow]
    graph_breaks: dict[str, int]  # reason -> count
    aten_ops: list[tuple[str, int, float]]  # (op, calls, seconds), costliest first
    time_split: dict[str, float]  # kernels / ATen ops / compile / the rest (seconds)
    peak_memory: str
    copy_bandwidth: dict[str, float]  # device -> bytes per second

    def write(self, path: str) -> str:
        from .page import render
        with open(path, "w") as f:
            f.write(render(self))
        return path


class _Counted:
    """A kernel launcher that counts its calls and their tensor bytes, then launches."""

    def __init__(self, launch, stats: KernelStats):
        self.launch = launch
        self.stats = stats

    def __call__(self, *args):
        stats = self.stats
        stats.calls += 1
        stats.bytes += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        start = time.perf_counter()
        try:
            return self.launch(*args)
        finally:
            stats.host_seconds += time.perf_counter() - start


class Capture:
    def __init__(self, title: str):
        self.title = title
        self.stats: dict[str, KernelStats] = collections.defaultdict(KernelStats)
        self.graphs: list = []
        self.wrapped: list[tuple[dict, str, object]] = []  # (namespace, name, launcher) to restore
        self.report: Report | None = None

    def _on_graph(self, graph) -> None:
        self.graphs.append(graph)
        namespace = getattr(graph, "namespace", None)
        if not namespace:  # a graph assembled elsewhere: its call's module
            call = getattr(graph.call, "call", graph.call)  # a CUDA graph recording's own call
            namespace = getattr(call, "__globals__", {})
        for name in graph.kernel_names:
            launcher = namespace.get(name)
            if launcher is not None and not isinstance(launcher, _Counted):
                self.wrapped.append((namespace, name, launcher))
                namespace[name] = _Counted(launcher, self.stats[name])

    @contextlib.contextmanager
    def running(self):
        from torch._dynamo.utils import counters
        breaks_before = collections.Counter(counters["graph_break"])
        observe.listeners.append(self._on_graph)
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        start = time.perf_counter()
        try:
            with torch.profiler.profile(activities=activities) as profile:
                yield self
        finally:
            seconds = time.perf_counter() - start
            observe.listeners.remove(self._on_graph)
            for namespace, name, launcher in self.wrapped:
                namespace[name] = launcher
        breaks = collections.Counter(counters["graph_break"])
        breaks.subtract(breaks_before)
        self.report = self._build(profile, seconds, {k: v for k, v in breaks.items() if v > 0}, cuda)

    def _build(self, profile, seconds: float, breaks: dict, cuda: bool) -> Report:
        kernel_names = {name for g in self.graphs for name in g.kernel_names}
        measured, aten = {}, []
        for event in profile.key_averages():
            device_seconds = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0)) / 1e6
            if event.key in kernel_names:
                measured[event.key] = device_seconds or event.self_cpu_time_total / 1e6
            elif event.key.startswith("aten::"):
                aten.append((event.key, event.count, event.self_cpu_time_total / 1e6))
        aten.sort(key=lambda row: -row[2])
        bandwidth = _copy_bandwidth([g for g in self.graphs])
        graphs, kernels = [], []
        for number, graph in enumerate(self.graphs):
            origins = dict(_ORIGINS.findall(graph.wrapper_source))
            graphs.append(GraphRow(number, graph.kind, list(graph.kernel_names), list(graph.fallback_ops),
                                   dict(graph.stage_seconds), graph.wrapper_source, graph.wrapper_path,
                                   getattr(graph, "planned_peak_bytes", None)))
            device = _device_of(graph)
            for name in graph.kernel_names:
                stats = self.stats.get(name, KernelStats())
                # A CPU kernel the profiler did not see (Triton's interpreter) ran inside the call.
                spent = measured.get(name) or (stats.host_seconds if device == "cpu" else 0.0)
                per_call = stats.bytes / stats.calls if stats.calls else 0.0
                share = None
                if stats.calls and spent > 0 and device in bandwidth:
                    share = (stats.bytes / spent) / bandwidth[device]
                kernels.append(KernelRow(name, number, origins.get(name, ""), graph.kernel_sources.get(name, ""),
                                         graph.kernel_paths.get(name, ""), stats.calls, per_call, spent, share))
        in_kernels = sum(k.seconds for k in kernels)
        in_aten = sum(row[2] for row in aten)
        compiling = sum(sum(g.stage_seconds.values()) for g in self.graphs)
        split = {"smelt kernels": in_kernels, "ATen ops": in_aten, "smelt compile stages": compiling,
                 "the rest (Dynamo, Python, waiting)": max(0.0, seconds - in_kernels - in_aten - compiling)}
        if cuda:
            peak = f"{torch.cuda.max_memory_allocated() / 2**20:.1f} MiB of CUDA memory at the peak (torch's allocator)"
        else:
            peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB resident at the process's peak"
        device = "cuda: " + torch.cuda.get_device_name() if cuda else "cpu"
        return Report(self.title, device, seconds, graphs, kernels, breaks, aten[:20], split, peak, bandwidth)


def _device_of(graph) -> str:
    match = re.search(r"GRAPH_DEVICE_TYPES = \('(\w+)'", graph.wrapper_source)
    return match.group(1) if match else "cpu"


def _copy_bandwidth(graphs) -> dict[str, float]:
    """Bytes per second a plain copy moves (read and write) on each device the graphs ran on."""
    found = {}
    for device in {_device_of(g) for g in graphs}:
        numel = (64 << 20) if device == "cuda" else (8 << 20)
        source = torch.empty(numel, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
        for _ in range(3):
            target.copy_(source)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        repeats = 10
        for _ in range(repeats):
            target.copy_(source)
        if device == "cuda":
            torch.cuda.synchronize()
        found[device] = 2 * source.numel() * source.element_size() * repeats / (time.perf_counter() - start)
    return found


@contextlib.contextmanager
def capture(title: str = "smelt compile report"):
    """`with smelt.report.capture() as c: ...` then `c.report.write("report.html")`."""
    c = Capture(title)
    with c.running():
        yield c
