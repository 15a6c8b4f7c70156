"""One settings object for smelt, and the one place where SMELT_* environment variables are read.

Every variable is declared once in SETTINGS (its parser, default and meaning); `Config()` reads
the per-compile ones and `setting(name)` any of them. Environment variables are read when
`Config()` is built, and `current()` builds a fresh one per compiled graph, so a test or a user may
change them between compiles. A value a parser refuses raises SettingError naming the variable and
what it accepts; an SMELT_* variable nobody reads (a typo) is warned about once.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import importlib.util
import logging
import os
import shutil
import tempfile
from typing import Any, Callable

from .backend_registry import BACKENDS as _REGISTERED
from .cache_location import usable
from .errors import SmeltError

log = logging.getLogger("smelt")


class SettingError(SmeltError, ValueError):
    """An SMELT_* environment variable holds a value smelt does not accept."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
BACKENDS = tuple(sorted(_REGISTERED))


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"smelt: {name}={raw!r} is not a boolean; accepted (any case): "
                       f"{', '.join(_TRUE)} for on, {', '.join(_FALSE)} for off")


def parse_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise SettingError(f"smelt: {name}={raw!r} is not accepted: it takes a positive integer (e.g. 4096)")
    return value


def parse_backend(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in BACKENDS:
        raise SettingError(f"smelt: {name}={raw!r} is not a backend; accepted: {', '.join(BACKENDS)}")
    return value


def parse_auto_switch(name: str, raw: str) -> str:
    value = raw.strip().lower()
    value = "on" if value in _TRUE else "off" if value in _FALSE else value
    if value not in ("auto", "on", "off"):
        raise SettingError(f"smelt: {name}={raw!r} is not accepted; accepted: auto (the target decides), "
                           f"{', '.join(_TRUE)} for on, {', '.join(_FALSE)} for off")
    return value


WEIGHT_GRADIENT_FORMS = ("kernel", "library", "reduction")


def parse_weight_gradient_form(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", *WEIGHT_GRADIENT_FORMS):
        raise SettingError(f"smelt: {name}={raw!r} is not accepted; accepted: auto (the target decides), "
                           f"{', '.join(WEIGHT_GRADIENT_FORMS)}")
    return value


def parse_path(name: str, raw: str) -> str:
    return os.path.abspath(os.path.expanduser(raw.strip()))


@dataclasses.dataclass(frozen=True)
class Setting:
    parse: Callable[[str, str], Any]
    default: Any  # used when the variable is unset or empty; a callable is called then
    accepted: str  # for the README and the unknown-variable warning


def default_cache_dir() -> str:
    """Per user, where the XDG base directory spec puts caches (as pip, ccache and Mesa do): it
    survives reboots, and unlike a fixed name in the shared /tmp no other user can own or squat it."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not os.path.isabs(base):  # the spec says to ignore a relative value
        home = os.path.expanduser("~")
        if not os.path.isabs(home):  # no HOME and no password entry: still one folder per user
            return os.path.join(tempfile.gettempdir(), f"smelt_cache_{os.getuid()}")
        base = os.path.join(home, ".cache")
    return os.path.join(base, "smelt")


@functools.lru_cache(maxsize=None)
def _missing_for_halide() -> tuple[str, ...]:
    return tuple(what for what, found in (("the halide package", importlib.util.find_spec("halide")),
                                          ("a C compiler `cc`", shutil.which("cc"))) if not found)


def default_cpu_backend() -> str:
    """Halide, where it can run: its package is installed and a C compiler links its kernels.
    Otherwise the Triton interpreter, which is slow but needs neither (said once, in the log, when
    a CPU kernel is first loaded: note_interpreted_cpu_kernels)."""
    return "triton" if _missing_for_halide() else "halide"


@functools.lru_cache(maxsize=None)
def _say_cpu_kernels_interpreted(missing: tuple[str, ...]) -> None:
    log.warning("smelt: CPU kernels run through Triton's interpreter (slow): Halide needs %s. "
                "Set SMELT_CPU_BACKEND to choose.", " and ".join(missing))


def note_interpreted_cpu_kernels(kernels) -> None:
    """Says once per process, where a graph's kernels are loaded (compiled now or read from the
    cache) and one is a CPU kernel for Triton's interpreter, that Halide could not be the default's
    choice, and why: not where the user chose Triton (SMELT_CPU_BACKEND, an override or
    torch.compile's options), nor for a program with no such kernel (a GPU model whose CPU scalars
    only reach ATen)."""
    chosen = os.environ.get("SMELT_CPU_BACKEND", "").strip() or "cpu_backend" in _overrides.get()
    if not chosen and _missing_for_halide() and any(k.interpret for k in kernels):
        _say_cpu_kernels_interpreted(_missing_for_halide())


_BOOL = "1/0, true/false, yes/no, on/off"
SETTINGS: dict[str, Setting] = {
    "SMELT_CPU_BACKEND": Setting(parse_backend, default_cpu_backend, ", ".join(BACKENDS)),
    "SMELT_CUDA_BACKEND": Setting(parse_backend, "triton", ", ".join(BACKENDS)),
    "SMELT_DEBUG_DIR": Setting(parse_path, None, "a folder"),
    "SMELT_CACHE_DIR": Setting(parse_path, default_cache_dir, "a folder"),
    "SMELT_GRAPH_CACHE": Setting(parse_bool, True, _BOOL),
    "SMELT_PERSISTENT_REDUCTION_LIMIT": Setting(parse_positive_int, 4096, "a positive integer"),
    "SMELT_SPLIT_REDUCTIONS": Setting(parse_bool, True, _BOOL),
    "SMELT_SPLIT_REDUCTION_MIN_NUMEL": Setting(parse_positive_int, 32768, "a positive integer"),
    "SMELT_FINISH_LIMIT": Setting(parse_positive_int, 16384, "a positive integer"),
    "SMELT_PERSISTENT_SCAN_LIMIT": Setting(parse_positive_int, 4096, "a positive integer"),
    "SMELT_EVICTION_HINTS": Setting(parse_bool, True, _BOOL),
    "SMELT_HALIDE_OPENMP": Setting(parse_bool, True, _BOOL),
    "SMELT_GEMM_EPILOGUES": Setting(parse_bool, True, _BOOL),
    "SMELT_ATTENTION_REWRITE": Setting(parse_bool, True, _BOOL),
    "SMELT_COMBO_KERNELS": Setting(parse_bool, True, _BOOL),
    "SMELT_BUFFER_POOL": Setting(parse_bool, True, _BOOL),
    "SMELT_MEMORY_ORDER": Setting(parse_bool, True, _BOOL),
    "SMELT_CPU_WORKSPACE": Setting(parse_bool, True, _BOOL),
    "SMELT_CHANNELS_LAST": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_MATMUL_PADDING": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_DEPTHWISE_KERNELS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_DEPTHWISE_WEIGHT_GRADIENT": Setting(parse_weight_gradient_form, "auto",
                                               "auto, " + ", ".join(WEIGHT_GRADIENT_FORMS)),
    "SMELT_ROW_VALUE_TILES": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_POINTWISE_CONVOLUTIONS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_SMALL_PRODUCTS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_FLOAT32_PRODUCT_BIAS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_HOST_SCALAR_ARGS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_PACKED_CONVOLUTIONS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_ONEDNN_PRODUCTS": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_SHORT_ATTENTION": Setting(parse_auto_switch, "auto", "auto, or " + _BOOL),
    "SMELT_AUTOTUNE": Setting(parse_bool, False, _BOOL),
    "SMELT_TUNE_ROWS": Setting(parse_bool, False, _BOOL),
    "SMELT_CUDA_GRAPHS": Setting(parse_bool, False, _BOOL),
    "SMELT_FREEZE_WEIGHTS": Setting(parse_bool, False, _BOOL),
    "SMELT_PROGRESS": Setting(parse_bool, False, _BOOL),
    "SMELT_COMPILE_WORKERS": Setting(parse_positive_int, lambda: usable_cores(), "a positive integer"),
    "SMELT_CHECK_CUDA_COMPILE": Setting(parse_bool, False, _BOOL),
    # Read once, by `import smelt` (preload.py).
    "SMELT_GC_FREEZE": Setting(parse_bool, True, _BOOL),
    "SMELT_GUARD_PROFILE": Setting(parse_bool, False, _BOOL),
    # Read by the fuzzer (smelt/tools/fuzz) to name the commit of a tree copied without git.
    "SMELT_COMMIT": Setting(lambda name, raw: raw.strip(), None, "a commit name"),
}
# Read by smelt's tests and benchmarks, not by smelt: known, so not warned about.
OUTSIDE_SMELT = ("SMELT_TEST_DEVICE", "SMELT_TEST_BACKEND", "SMELT_TEST_SHARD", "SMELT_TEST_SECOND_BACKEND",
                 "SMELT_MODEL_SUITE", "SMELT_SUITE_TIMING_LOCK")


def usable_cores() -> int:
    """The cores this process may run on: a process pinned by taskset or a container's cpuset gets
    fewer than os.cpu_count(), and a worker pool sized by the machine would oversubscribe them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return os.cpu_count() or 1


def setting(name: str) -> Any:
    """The value of SMELT_* variable `name`, parsed; its default when unset or empty."""
    spec = SETTINGS[name]
    raw = os.environ.get(name, "")
    if raw.strip():
        return spec.parse(name, raw)
    return spec.default() if callable(spec.default) else spec.default


def _field(name: str):
    return dataclasses.field(default_factory=lambda: setting(name), metadata={"variable": name})


@dataclasses.dataclass(frozen=True)
class Config:
    # Which code generator runs graphs whose tensors live on the CPU: compiled Halide pipelines, or
    # (`triton`) Triton kernels run by its interpreter, which is slow and there to test Triton codegen.
    cpu_backend: str = _field("SMELT_CPU_BACKEND")
    cuda_backend: str = _field("SMELT_CUDA_BACKEND")
    # When set, every compiled graph dumps its stages into its own subfolder here.
    debug_dir: str | None = _field("SMELT_DEBUG_DIR")
    # Where generated sources, kernel libraries and cached graphs are written (cache_location.py
    # swaps in a private temporary folder, with the graph cache off, when this one is unusable).
    cache_dir: str = _field("SMELT_CACHE_DIR")
    # Compiled graphs are kept under cache_dir and reused by later processes (SMELT_GRAPH_CACHE=0: never).
    graph_cache: bool = _field("SMELT_GRAPH_CACHE")
    # Reductions whose rows are at most this long keep the whole row in registers.
    persistent_reduction_limit: int = _field("SMELT_PERSISTENT_REDUCTION_LIMIT")
    # Reductions with few outputs over many elements run in two kernels: partial results over
    # chunks of each row, then a reduction of the partials (lowering/split_reduction.py).
    split_reductions: bool = _field("SMELT_SPLIT_REDUCTIONS")
    # Only reductions whose every program would read at least this many elements are split (a
    # row's length, or a column block's rows times columns); tests lower it to split small tensors.
    split_reduction_min_numel: int = _field("SMELT_SPLIT_REDUCTION_MIN_NUMEL")
    # The most outputs x reduced elements a small reduction may have to run in the last program of
    # the reduction before it (scheduler/finishers.py); it may also read 4 bytes per such element
    # of other small buffers (a product's weight).
    finish_limit: int = _field("SMELT_FINISH_LIMIT")
    # Scans (cumsum, cummax, ...) whose rows are at most this long scan the whole row in registers;
    # longer rows are scanned block by block, carrying the running value.
    persistent_scan_limit: int = _field("SMELT_PERSISTENT_SCAN_LIMIT")

    # Cache hints on the loads of reduction kernels (codegen/triton/eviction.py); SMELT_EVICTION_HINTS=0: none.
    eviction_hints: bool = _field("SMELT_EVICTION_HINTS")

    # Halide's CPU kernels run their parallel loops on torch's OpenMP threads (runtime/halide_threads.py),
    # read when the process first loads a Halide kernel; SMELT_HALIDE_OPENMP=0: Halide's own pool.
    halide_openmp: bool = _field("SMELT_HALIDE_OPENMP")

    # Independent small kernels share one launch (scheduler/combo.py); off: each launches alone, so
    # a profile names every member's time.
    combo_kernels: bool = _field("SMELT_COMBO_KERNELS")

    # A buffer takes the memory of a dead one of its size instead of allocating (scheduler/pool.py);
    # off: every buffer is allocated, as to compare host times.
    buffer_pool: bool = _field("SMELT_BUFFER_POOL")

    # A step that frees more than it allocates runs as soon as its inputs are ready, where that
    # lowers the graph's peak (scheduler/memory_order.py); off: the traced graph's order.
    memory_order: bool = _field("SMELT_MEMORY_ORDER")

    # A CPU graph's buffers that live only inside a call get places in one block per thread, kept
    # between calls (scheduler/workspace.py); off: each is allocated (and its pages faulted in) per call.
    cpu_workspace: bool = _field("SMELT_CPU_WORKSPACE")

    # A linear layer's GELU (tanh) or ReLU applied by cuBLASLt's epilogue on CUDA half floats
    # (lowering/gemm_epilogue.py); SMELT_GEMM_EPILOGUES=0: a pointwise kernel applies it.
    gemm_epilogues: bool = _field("SMELT_GEMM_EPILOGUES")

    # Attention written by hand (softmax(q @ k^T * scale + mask) @ v) runs as one SDPA call
    # (lowering/handwritten_attention.py); off: as the ops it is written in.
    attention_rewrite: bool = _field("SMELT_ATTENTION_REWRITE")

    # Convolution nets in channels-last memory (lowering/layout_plan.py): "auto" where the backend's
    # Target runs convolutions faster so (cuDNN on CUDA), "on" everywhere, "off" never.
    channels_last: str = _field("SMELT_CHANNELS_LAST")
    # Large matrix products with rows of a misaligned length run on zero-padded rows
    # (lowering/matmul_padding.py): "auto" where the Target's library needs aligned rows (cuBLAS).
    matmul_padding: str = _field("SMELT_MATMUL_PADDING")
    # Depthwise convolutions as smelt kernels (lowering/depthwise_convolution.py): "auto" where the
    # Target says they beat the library (cuDNN's on the GPU).
    depthwise_kernels: str = _field("SMELT_DEPTHWISE_KERNELS")
    # Where a depthwise backward lowered by smelt computes the weight's gradient
    # (lowering/depthwise_convolution_backward.py): "kernel" (smelt's Triton kernel for channels-last
    # CUDA tensors), "library" (cuDNN's), "reduction" (smelt's IR); "auto": the Target's choice.
    depthwise_weight_gradient: str = _field("SMELT_DEPTHWISE_WEIGHT_GRADIENT")
    # Pointwise kernels walked as rows where some values depend on the row or the column alone (a
    # batch norm's per-channel scale), computed once per tile row or column (scheduler/tiling.py):
    # "auto" where the Target says so (Target.rows_for_row_values).
    row_value_tiles: str = _field("SMELT_ROW_VALUE_TILES")
    # 1x1 convolutions over channels-last activations as matrix products
    # (lowering/convolution_calls.py): "auto" where the Target says so.
    pointwise_convolutions: str = _field("SMELT_POINTWISE_CONVOLUTIONS")
    # 1x1 convolutions of few multiply-adds (a squeeze-excite block's) as reductions in smelt's
    # kernels (lowering/small_products.py): "auto" over pooled inputs up to the Target's limit (none
    # on the CPU), "on" over images too, up to it or 2**22 where it names none.
    small_products: str = _field("SMELT_SMALL_PRODUCTS")
    # A float32 addmm read only by elementwise ops as mm, its bias added by the kernel after it
    # (lowering/extern_calls.py): "auto" where the Target says so.
    float32_product_bias: str = _field("SMELT_FLOAT32_PRODUCT_BIAS")
    # A zero-dimensional float CPU input passed to Triton kernels by value (lowering/graph.py): "auto"
    # in GPU graphs where the Target says so; "on" in CPU graphs too (the GPU's form, run by Triton's
    # interpreter: tests and the fuzzer); "off" never (read from memory; GPU ops reading it run in ATen).
    host_scalar_args: str = _field("SMELT_HOST_SCALAR_ARGS")
    # Float32 CPU convolutions through oneDNN with the weight in its blocked layout
    # (runtime/packed_convolution.py; kept between calls with freeze_weights): "auto" where the Target says so.
    packed_convolutions: str = _field("SMELT_PACKED_CONVOLUTIONS")
    # A float32 CPU product over a Linear's weight through oneDNN's linear (runtime/onednn_linear.py):
    # "auto" where the Target says so and timing both libraries on the shape found oneDNN faster
    # (kept in cache_dir/autotune), "on" always, "off" ATen's mm / addmm.
    onednn_products: str = _field("SMELT_ONEDNN_PRODUCTS")
    # Attention written by hand over fewer than 64 keys (Swin's windows) as one Triton kernel,
    # smelt::short_attention (runtime/short_attention.py), with attention_rewrite on: "auto" where
    # the Target says so (inference and training apart), "on" in both.
    short_attention: str = _field("SMELT_SHORT_ATTENTION")

    # Time a few block configurations of each kernel on its first launch and keep the fastest
    # (cached on disk under cache_dir/autotune). Off: the block heuristic alone decides.
    autotune: bool = _field("SMELT_AUTOTUNE")
    # Without autotune: a CUDA kernel storing per element of whole rows in registers (a norm, a
    # softmax) times a few warp counts on its first launch (codegen/triton/candidates.py row_candidates),
    # built ahead in the compile workers, the choice cached on disk as autotune's. Opt-in: on the H100
    # BERT's residual + LayerNorm measured no faster with it (RESULTS, sixtieth session).
    tune_rows: bool = _field("SMELT_TUNE_ROWS")

    # Graphs on CUDA are recorded as CUDA graphs and replayed (runtime/cuda_graphs.py): one launch
    # per call. torch.compile(..., mode="reduce-overhead") turns it on for that compile.
    cuda_graphs: bool = _field("SMELT_CUDA_GRAPHS")

    # Inference only: what a graph computes from the module's parameters and buffers alone (a
    # convolution weight's channels-last copy, an autocast's cast of a weight) is computed once and
    # kept, again only when a weight's storage or version counter moves (lowering/frozen_weights.py).
    # Opt-in: a change that bypasses the version counter (`param.data.copy_(...)`) is not seen.
    freeze_weights: bool = _field("SMELT_FREEZE_WEIGHTS")

    # A compile's kernels that take more than 2 s to build are counted in log lines (always) and,
    # with this on, in a bar on stderr when it is a terminal (smelt/progress.py).
    progress: bool = _field("SMELT_PROGRESS")

    # Processes that compile a graph's CPU kernels at once (runtime/compile_pool.py); 1: one after
    # another, in the compiling process.
    compile_workers: int = _field("SMELT_COMPILE_WORKERS")

    # Every Triton kernel run by the CPU interpreter is also generated as it would be for CUDA and
    # compiled for sm_90 at its first launch (runtime/cuda_compile_check.py): the interpreter runs
    # code the GPU compiler refuses, so a CPU run alone does not show that a kernel builds on a GPU.
    check_cuda_compile: bool = _field("SMELT_CHECK_CUDA_COMPILE")

    def backend_for(self, device_type: str) -> str:
        if device_type == "cpu":
            return self.cpu_backend
        if device_type == "cuda":
            return self.cuda_backend
        raise ValueError(f"smelt: no code generator for device type {device_type!r}")


_warned_unknown: set[frozenset] = set()


def warn_unknown_variables() -> None:
    """One warning per set of SMELT_* variables that nothing reads (a typo leaves a setting at its default)."""
    unknown = frozenset(n for n in os.environ
                        if n.startswith("SMELT_") and n not in SETTINGS and n not in OUTSIDE_SMELT)
    if not unknown or unknown in _warned_unknown:
        return
    _warned_unknown.add(unknown)
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, SETTINGS, n=1)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    log.warning("smelt: ignoring unknown environment variable(s) %s; smelt reads: %s",
                ", ".join(hints), ", ".join(SETTINGS))


_overrides: contextvars.ContextVar[dict] = contextvars.ContextVar("smelt_config_overrides", default={})


@contextlib.contextmanager
def override(**fields):
    """Settings for the compiles inside the block, whatever the environment says (tests, and
    benchmarks that compare settings in one process): Config's field names, each value checked as
    its SMELT_* variable's would be. Blocks nest; leaving one restores the settings before it."""
    variables = {f.name: f.metadata["variable"] for f in dataclasses.fields(Config)}
    checked = {}
    for name, value in fields.items():
        if name not in variables:
            raise SettingError(f"smelt: config.override({name}=...): no such setting; accepted: "
                               f"{', '.join(sorted(variables))}")
        variable = variables[name]
        checked[name] = value if value is None else SETTINGS[variable].parse(variable, str(value))
    token = _overrides.set({**_overrides.get(), **checked})
    try:
        yield
    finally:
        _overrides.reset(token)


def overridden() -> dict:
    """The settings the enclosing override blocks set (a backward compiled later, on autograd's
    own thread, is compiled under them too)."""
    return dict(_overrides.get())


def current() -> Config:
    """The settings of the compile starting now (the environment's, under any override), with a
    cache folder it can write to."""
    warn_unknown_variables()
    return usable(dataclasses.replace(Config(), **_overrides.get()))
