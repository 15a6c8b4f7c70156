"""Compiles generated Halide pipelines to shared libraries, kept on disk for later processes.

A kernel is compiled ahead of time (`compile_to_file`, one object file) without Halide's runtime
and linked into a small shared library that depends on one shared copy of the runtime, built once
per Halide version and target. Measured on the 2-core CPU: a kernel object with its own runtime
took 0.85 s to compile, without it 0.05 s; the runtime alone 0.7 s, once. A later process finds
the library by its key (source, Halide version, target) and only loads it.
"""
from __future__ import annotations

import ast
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.metadata
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

from ..errors import HalideRefusedKernel, KernelCompileError
from . import checked_files

log = logging.getLogger("smelt.runtime")
RUNTIME_NAME = "libsmelt_halide_runtime"


@functools.lru_cache(maxsize=None)
def halide_version() -> str:
    return importlib.metadata.version("halide")


@functools.lru_cache(maxsize=None)
def target():
    """The host, for the shared runtime."""
    import halide as hl
    return hl.get_host_target()


@functools.lru_cache(maxsize=None)
def kernel_target(checks_indices: bool = True):
    """The host without Halide's fast-math: NaN compares as IEEE says (argmax, max and cummax see NaN
    as eager does) and no float math is reassociated. Without the runtime, which is shared.

    Without bounds queries (the launcher describes every buffer in full) and, unless the kernel
    `checks_indices` (an hl.require on a gathered index, which raises IndexError as eager does),
    without Halide's asserts: every load of a generated kernel is in bounds by construction (indices
    are clamped or masked, sizes checked by the wrapper) and the launcher checks buffer types and
    extents itself (halide_launcher, launch_ext.c). The checks took a third of compile_to_file's time
    over a sample of 400 kernels, two thirds of it for Adam's 150-tensor kernels
    (benchmarks/probes/halide_target_features.py)."""
    import halide as hl
    features = [hl.TargetFeature.NoRuntime, hl.TargetFeature.StrictFloat, hl.TargetFeature.NoBoundsQuery]
    if not checks_indices:
        features.append(hl.TargetFeature.NoAsserts)
    kernel = target()
    for feature in features:
        kernel = kernel.with_feature(feature)
    return kernel


def checks_indices(source: str) -> bool:
    """Whether a kernel's ASSERTS line asks for Halide's asserts (it checks gathered indices;
    codegen/halide/kernel.py decides)."""
    return "\nASSERTS = True" in source


def target_for(source: str):
    """The host target a kernel's source compiles for."""
    return kernel_target(checks_indices(source))


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


# Part of the folder's name: libraries written before they had a recorded hash are never read.
LAYOUT = "checked-1"


def _folder(cache_dir: str) -> str:
    folder = os.path.join(cache_dir, "halide", _key(halide_version(), target().to_string(), LAYOUT)[:12])
    os.makedirs(folder, exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(path: str):
    """One process builds a file at a time; the others wait and then find it built."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_cc(args: list[str], what: str, setting: str = "SMELT_CPU_BACKEND") -> None:
    """Runs the system C compiler; `what` names the step in errors, `setting` the way around it."""
    cmd = ["cc", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise KernelCompileError(f"smelt: the Halide backend needs the system C compiler `cc` ({what}), which is "
                                 f"not on PATH: install one, or set {setting}=triton") from None
    if done.returncode != 0:
        raise KernelCompileError(f"smelt: {what} failed: {' '.join(cmd)}\n{done.stderr}")


def _link(objects: list[str], out: str, extra: list[str] = ()) -> None:
    run_cc(["-shared", "-o", out, *objects, *extra], f"linking {out}")


def build_checked(path: str, build) -> bool:
    """Makes sure `path` holds an intact build (checked_files): returns False when it already did,
    else runs `build(tmp)`, which leaves the finished file at `tmp/out`, installs it and returns True.
    A damaged file is removed, with a warning, and built again."""
    if checked_files.problem(path) is None:
        return False
    with _locked(path):
        problem = checked_files.problem(path)
        if problem is None:
            return False
        if problem != checked_files.MISSING:
            checked_files.discard(path, problem)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
            build(tmp)
            checked_files.install(os.path.join(tmp, "out"), path)
    return True


# Libraries this process holds intact whose names (with their folders' names) say all they depend on:
# Halide's runtimes (Halide's version, the target, the shim) and smelt's own C helpers (their source's
# hash). A new cache folder gets a copy instead of a build (Halide's runtime 1-1.5 s, CUDA's 3-4 s; the
# test suite makes a folder per test).
_NAMED_LIBRARIES: dict[str, str] = {}


def build_named_checked(path: str, build) -> None:
    """build_checked for a library named by its content: a copy of the same library in another cache
    folder where this process has one, else built."""
    name = os.path.join(*path.split(os.sep)[-2:])

    def copy_or_build(tmp: str) -> None:
        earlier = _NAMED_LIBRARIES.get(name)
        if earlier and earlier != path and checked_files.problem(earlier) is None:
            shutil.copyfile(earlier, os.path.join(tmp, "out"))
        else:
            build(tmp)
    build_checked(path, copy_or_build)
    _NAMED_LIBRARIES[name] = path


def runtime_library(cache_dir: str) -> str:
    """Path of the shared Halide runtime every kernel library links against."""
    import halide as hl

    def build(tmp: str) -> None:
        obj = os.path.join(tmp, "runtime.o")
        hl.compile_standalone_runtime(obj, target())
        _link([obj], os.path.join(tmp, "out"), ["-lpthread", "-ldl", "-lm"])

    path = os.path.join(_folder(cache_dir), f"{RUNTIME_NAME}.so")
    build_named_checked(path, build)
    return path


_C_STDIO = ctypes.CDLL(None)


@contextlib.contextmanager
def compiler_messages_to_log(name: str):
    """Halide's compiler prints its warnings (bfloat16 math emulated on this CPU, ...) to stdout,
    through Python's sys.stdout or, from C++, to file descriptor 1: kept out of the user's output,
    they go to smelt's debug log instead."""
    sys.stdout.flush()
    _C_STDIO.fflush(None)
    saved = os.dup(1)
    python_side = io.StringIO()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        try:
            with contextlib.redirect_stdout(python_side):
                yield
        finally:
            _C_STDIO.fflush(None)  # C++ streams write through C's buffered stdout
            os.dup2(saved, 1)
            os.close(saved)
            captured.seek(0)
            text = (python_side.getvalue() + captured.read().decode(errors="replace")).strip()
            if text:
                log.debug("smelt: Halide's compiler on kernel %s:\n%s", name, text)


def load_source(name: str, source: str, path: str | None = None) -> types.SimpleNamespace:
    """Runs a generated module's source; its names as attributes."""
    namespace: dict = {}
    exec(compile(source, path or f"<{name}>", "exec"), namespace)
    return types.SimpleNamespace(**namespace)


# The names a launcher reads from a generated module, each a literal on a line of its own
# (codegen/halide/kernel.py writes them so), maybe followed by a comment.
LAUNCH_FIELDS = ("INPUTS", "OUTPUTS", "SIZES", "DTYPES", "DEVICE", "ASSERTS")
_LAUNCH_FIELD = re.compile(rf"^({'|'.join(LAUNCH_FIELDS)}) = (.+?)(?:  # .*)?$", re.M)


def launch_header(name: str, source: str) -> types.SimpleNamespace:
    """A generated module's launch arguments, dtypes and target, read without running it: running it
    imports Halide (20 ms) and defines its pipeline, which only a build needs (MobileNetV3's warm
    start: its 56 cached kernels' launchers in 47 ms against 80; benchmarks/probes/warm_start_parts.py)."""
    texts = {m.group(1): m.group(2) for m in _LAUNCH_FIELD.finditer(source)}
    missing = [f for f in LAUNCH_FIELDS if f not in texts]
    if missing:
        raise KernelCompileError(f"smelt: Halide kernel {name}'s source does not assign {', '.join(missing)} "
                                 f"as literals, which its launcher reads")
    values = ast.literal_eval(f"({', '.join(texts[f] for f in LAUNCH_FIELDS)},)")  # one parse, not six
    return types.SimpleNamespace(**dict(zip(LAUNCH_FIELDS, values)))


# A comment to the line's end: no quote follows its '#', so the '#' is not inside a string.
_COMMENT = re.compile(r"[ \t]*#[^\"'\n]*$", re.M)
_BUFFER = re.compile(r"\bbuf(\d+)(?=_|\b)")


def canonical_source(name: str, source: str) -> str:
    """The kernel's source without its name and comments, its graph's buffer names (which name
    its Funcs) numbered in order of appearance. Kernels that differ only there compute alike (a
    model's repeated layers, an optimizer's parameters of one size) and share one library."""
    text = _COMMENT.sub("", source.replace(name, "KERNEL"))
    numbers: dict[str, str] = {}
    return _BUFFER.sub(lambda m: "buf" + numbers.setdefault(m.group(1), str(len(numbers))), text)


def library_path(name: str, source: str, cache_dir: str, target=None) -> tuple[str, str]:
    """(where kernel `name`'s library is kept, the name its pipeline is exported under)."""
    target = target_for(source) if target is None else target
    canonical = canonical_source(name, source)
    symbol = f"halide_kernel_{_key(canonical)}"
    return os.path.join(_folder(cache_dir), f"{symbol}_{_key(canonical, halide_version(), target.to_string())}.so"), symbol


def is_built(name: str, source: str, cache_dir: str) -> bool:
    """Whether kernel `name`'s library for the host is in the cache, intact."""
    return checked_files.problem(library_path(name, source, cache_dir)[0]) is None


def kernel_library(name: str, source: str, cache_dir: str, path: str | None = None, target=None,
                   runtime: str | None = None) -> tuple[str, str, float]:
    """(path of the compiled library of kernel `name`, the name its pipeline is exported under, the
    seconds spent compiling it: 0 if cached). By default for the host, linked against
    runtime_library; the CUDA path passes its own. The library is shared by every kernel of the
    same canonical_source."""
    import time
    target = target_for(source) if target is None else target
    library, symbol = library_path(name, source, cache_dir, target)
    if checked_files.problem(library) is None:
        return library, symbol, 0.0
    runtime = runtime_library(cache_dir) if runtime is None else runtime
    start = time.perf_counter()

    def build(tmp: str) -> None:
        module = load_source(name, source, path)
        try:
            pipeline, arguments = getattr(module, name)()
            prefix = os.path.join(tmp, symbol)
            with compiler_messages_to_log(name):
                pipeline.compile_to_file(prefix, arguments, symbol, target)
            _link([prefix + ".o"], os.path.join(tmp, "out"), [runtime, f"-Wl,-rpath,{os.path.dirname(runtime)}"])
        except KernelCompileError:
            raise
        except Exception as e:
            message = (f"smelt: Halide kernel {name} ({target}) did not compile; source: {path}; "
                       f"error: {type(e).__name__}: {e}")
            if type(e).__name__ == "HalideError":  # Halide rejected the program: the kernel goes to Triton
                raise HalideRefusedKernel(message, name) from e
            raise KernelCompileError(message) from e  # an error in the generated source: smelt's bug

    if not build_checked(library, build):
        return library, symbol, 0.0
    return library, symbol, time.perf_counter() - start
