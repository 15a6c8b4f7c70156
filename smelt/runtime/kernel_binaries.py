"""Compiled GPU kernels kept by smelt, so that a later process launches them without Triton's JIT.

At the first launch of a kernel in a process, Triton's JIT hashes Triton's own installation (its
sources and its shared library, about half a second on an H100 host) before it looks in its disk
cache. smelt keeps, per kernel source and argument specialization, the binary Triton compiled
and the exact specialization Triton compiled it for (signature, constants, attributes). A later
process that launches the same source with arguments of the same specialization rebuilds
`triton.compiler.CompiledKernel` from those files and launches it directly.

A stored variant is used only when every assumption Triton compiled it under holds for the
arguments at hand (pointer and integer divisibility, integers specialized to a constant, integer
widths); a variant with an attribute smelt does not know, or arguments it cannot describe, go
through the JIT, which is always correct.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil

import torch
import triton

log = logging.getLogger("smelt.graph_cache")

_KNOWN_ATTRIBUTES = {"tt.divisibility"}
_INT_RANGES = {"i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1), "u64": (0, 2**64 - 1)}


def describe_arguments(args) -> tuple | None:
    """What selects a compiled variant: each argument's type, and what Triton's JIT specializes
    on (16-byte alignment of pointers; integers equal to 1, divisible by 16, or wider than 32
    bits). None for an argument smelt's kernels never take."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            spec.append(("bool", a))
        elif isinstance(a, int):
            spec.append(("int", a == 1, a % 16 == 0, -2**31 <= a < 2**31))
        elif isinstance(a, float):
            spec.append(("float",))
        else:
            return None
    return tuple(spec)


@functools.lru_cache(maxsize=None)
def _triton_installation() -> str:
    """Stands in for Triton's hash of itself: version, place and shared library's size and date."""
    root = os.path.dirname(triton.__file__)
    libs = sorted(f for f in os.listdir(os.path.join(root, "_C")) if f.startswith("libtriton"))
    stats = [(f, os.stat(os.path.join(root, "_C", f)).st_size, os.stat(os.path.join(root, "_C", f)).st_mtime_ns)
             for f in libs]
    return json.dumps([triton.__version__, root, stats])


def _jit_environment() -> str:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    knobs = triton.knobs
    return json.dumps([_triton_installation(), sorted(get_cache_invalidating_env_vars().items()),
                       bool(knobs.runtime.debug), str(getattr(knobs.compilation, "instrumentation_mode", ""))])


def variant_key(source: str, spec: tuple, constexprs: dict, device) -> str:
    # smelt's own source stands for the helpers a kernel imports from smelt.
    from ..graph_cache.fingerprint import smelt_source_digest
    capability = torch.cuda.get_device_capability(device)
    text = json.dumps([_jit_environment(), smelt_source_digest(), hashlib.sha256(source.encode()).hexdigest(),
                       spec, sorted(constexprs.items()), list(capability)])
    return hashlib.sha256(text.encode()).hexdigest()


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _folder(cache_dir: str, key: str) -> str:
    return os.path.join(cache_dir, "kernels", key[:2], key)


def save_variant(cache_dir: str, key: str, compiled) -> None:
    """Keep a kernel Triton's JIT just compiled; quietly skipped when it cannot be described."""
    src = compiled.src
    try:
        record = {"signature": dict(src.signature),
                  "constants": [[list(path), value] for path, value in src.constants.items()],
                  "attrs": [[list(path), value] for path, value in src.attrs.items()],
                  "files": {}, "sha256": {}}
        json.dumps(record)  # constants of other types (dtypes, constexpr objects) are not kept
    except (TypeError, ValueError, AttributeError):
        return
    folder = _folder(cache_dir, key)
    tmp = f"{folder}.{os.getpid()}.tmp"
    try:
        os.makedirs(tmp, exist_ok=True)
        for name, path in compiled.metadata_group.items():
            if name.endswith((".json", ".cubin", ".hsaco")):
                shutil.copyfile(path, os.path.join(tmp, name))
                record["files"][name] = name
                record["sha256"][name] = _file_digest(path)
        with open(os.path.join(tmp, "variant.json"), "w") as f:
            json.dump(record, f)
        os.replace(tmp, folder)  # a reader sees the whole folder or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process may have written it first


def load_variant(cache_dir: str, key: str, fn):
    """The CompiledKernel kept under `key`, or None."""
    folder = _folder(cache_dir, key)
    try:
        with open(os.path.join(folder, "variant.json")) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("smelt: ignoring kept kernel %s (%s); Triton compiles it", folder, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    try:
        from triton.compiler.compiler import ASTSource, CompiledKernel
        group = {name: os.path.join(folder, file) for name, file in record["files"].items()}
        if any(_file_digest(path) != record["sha256"][name] for name, path in group.items()):
            raise ValueError("a file does not match its hash")
        metadata_file = next(p for name, p in group.items() if name.endswith(".json"))
        with open(metadata_file) as f:
            kernel_hash = json.load(f)["hash"]
        src = ASTSource(fn, record["signature"],
                        constexprs={tuple(path): value for path, value in record["constants"]},
                        attrs={tuple(path): value for path, value in record["attrs"]})
        kernel = CompiledKernel(src, group, kernel_hash)
        kernel._init_handles()  # loads the binary now, so that a failure here falls back to the JIT
    except Exception as e:  # a damaged folder: compiling again is always right
        log.warning("smelt: ignoring kept kernel %s (%s: %s); Triton compiles it", folder, type(e).__name__, e)
        shutil.rmtree(folder, ignore_errors=True)  # so that the JIT's variant can be kept in its place
        return None
    return kernel


def assumptions_hold(kernel, args) -> bool:
    """Whether every assumption the kernel was compiled under holds for `args`, which lists every
    parameter of the kernel in order, constexpr ones included."""
    src = kernel.src
    attrs = {path: value for path, value in src.attrs.items()}
    for index, (name, kind) in enumerate(src.signature.items()):
        path = (index,)
        arg = args[index]
        for attr in attrs.get(path, []):
            attr_name, attr_value = attr
            if attr_name not in _KNOWN_ATTRIBUTES:
                return False
            value = arg.data_ptr() if isinstance(arg, torch.Tensor) else arg
            if not isinstance(value, int) or value % attr_value != 0:
                return False
        if kind == "constexpr":
            if path not in src.constants or src.constants[path] != arg or type(arg) is bool:
                return False
        elif kind.startswith("*"):
            if not isinstance(arg, torch.Tensor):
                return False
        elif kind in _INT_RANGES:
            low, high = _INT_RANGES[kind]
            if type(arg) is not int or not low <= arg <= high:
                return False
        elif kind in ("fp32", "fp64"):
            if type(arg) is not float:
                return False
        else:
            return False
    return len(args) == len(src.signature)


class KeptKernels:
    """The compiled variants of one GPU kernel source kept on disk (see the module docstring)."""

    def __init__(self, fn, source: str, cache_dir: str):
        self.fn = fn  # the kernel's JITFunction, which a rebuilt variant refers to
        self.source = source
        self.cache_dir = cache_dir

    def _key(self, args, constexprs: dict) -> str | None:
        spec = describe_arguments(args)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if spec is None or device is None or device.type != "cuda":
            return None
        return variant_key(self.source, spec, constexprs, device)

    def load(self, args, constexprs: dict, constexpr_values: list):
        """A kept variant for these arguments (the constexpr values come last) or None."""
        try:
            key = self._key(args, constexprs)
            kernel = load_variant(self.cache_dir, key, self.fn) if key is not None else None
            if kernel is None or not assumptions_hold(kernel, [*args, *constexpr_values]):
                return None
        except Exception as e:  # noqa: BLE001 - a Triton whose internals differ: the JIT still works
            log.warning("smelt: kept kernels unavailable (%s: %s); Triton compiles", type(e).__name__, e)
            return None
        return kernel

    def save(self, args, constexprs: dict, compiled) -> None:
        """Keep a variant the JIT just compiled for these arguments."""
        try:
            key = self._key(args, constexprs)
            if key is not None:
                save_variant(self.cache_dir, key, compiled)
        except Exception as e:  # noqa: BLE001 - keeping is an optimization; the launch already happened
            log.warning("smelt: could not keep a compiled kernel (%s: %s)", type(e).__name__, e)
