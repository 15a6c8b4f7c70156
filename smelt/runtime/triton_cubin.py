"""Compiling one Triton kernel for a CUDA target, and the kept binary's files, without torch.

The compiling process (cuda_binary.py, through kernel_binaries.py) and the compile workers
(compile_worker.py, which import no torch so that they start in a fraction of a second) share
this module: a binary a worker keeps is read back by cuda_binary.CudaBinary.read.

A launch's arguments are described per argument as cuda_binary.describe does: ("ptr", dtype name,
16-byte aligned), ("i32" or "i64", divisible by 16) or ("fp32",).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading

log = logging.getLogger("smelt.runtime")


class CudaError(RuntimeError):
    pass


# Each ATen op rounds its result, as eager does: contracting a product into a later add or subtract
# (an FMA) makes x * y - sum([x * y]) the product's rounding error instead of 0 (the H100 fuzzer
# found layer_norm's gradient over one element at 6e-6 where eager's is exactly 0).
CUDA_COMPILE_OPTIONS = {"enable_fp_fusion": False}
# A kernel that checks its indirect indices (tl.device_assert, codegen/triton/handler.py) compiles
# in Triton's debug mode, without which the check is compiled out: an index out of bounds then
# stops the program as eager's does (a device-side assert), not reading past the tensor. Debug
# mode's checks of int32 arithmetic for overflow stay off: smelt picks index widths itself.
CHECKED_OPTIONS = {"debug": True, "sanitize_overflow": False}


def compile_options(source: str) -> dict:
    """Triton's compile options for a kernel, from its source."""
    if "tl.device_assert(" in source:
        return {**CUDA_COMPILE_OPTIONS, **CHECKED_OPTIONS}
    return dict(CUDA_COMPILE_OPTIONS)


def triton_signature(fn, spec, constexprs: dict):
    """Triton's (signature, constexprs, attrs) for an ASTSource of `fn` with these arguments."""
    from triton._utils import canonicalize_dtype  # takes a dtype's name ("torch.float16" or "float16")
    signature, constants, attrs = {}, {}, {}
    runtime = iter(spec)
    for index, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constants[(index,)] = constexprs[param.name]
            continue
        kind = next(runtime)
        if kind[0] == "ptr":
            signature[param.name] = "*" + canonicalize_dtype(kind[1])
            aligned = kind[2]
        elif kind[0] in ("i32", "i64"):
            signature[param.name] = kind[0]
            aligned = kind[1]
        else:
            signature[param.name] = kind[0]
            aligned = False
        if aligned:
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constants, attrs


def compile_cubin(fn, spec, constexprs: dict, num_warps: int, capability, options: dict,
                  cache_dir: str | None = None) -> dict:
    """Compile `fn` (a JITFunction) for one argument description; returns CudaBinary's fields.
    Raises triton.CompilationError for a kernel that does not compile and CudaError for one that
    smelt's launcher cannot launch. With smelt's `cache_dir`, Triton's own cache of the compile's
    stages goes under it too (triton_cache_in)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    signature, constants, attrs = triton_signature(fn, spec, constexprs)
    source = ASTSource(fn, signature, constexprs=constants, attrs=attrs)
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    with triton_cache_in(cache_dir):
        compiled = triton.compile(source, target=target, options={"num_warps": num_warps, **options})
    meta = compiled.metadata
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, scratch, 0):
            raise CudaError(f"kernel needs {scratch.split('_')[0]} scratch memory")
    if getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False) \
            or getattr(meta, "launch_pdl", False):
        raise CudaError("kernel needs a cluster, cooperative or programmatic-dependent launch")
    arg_kinds = tuple(k[0] for k in spec)
    extra = entry_param_count(compiled.asm["ptx"], meta.name) - len(arg_kinds)
    if extra < 0:
        raise CudaError("kernel takes fewer parameters than smelt passes")
    return {"name": meta.name, "cubin": compiled.asm["cubin"], "num_warps": meta.num_warps, "shared": meta.shared,
            "arg_kinds": arg_kinds, "extra_params": extra}


_CACHE_KNOB_LOCK = threading.Lock()


@contextlib.contextmanager
def triton_cache_in(cache_dir: str | None):
    """Triton's cache for the compiles inside, at `cache_dir`/triton rather than ~/.triton: an empty
    smelt cache folder is then a cold compile (the model suite's compile column had read Triton's
    cache warmed by its own accuracy check), and clearing the folder clears all smelt compiled.
    Triton's cache knob is one per process: the lock keeps two threads from restoring each other's."""
    if cache_dir is None:
        yield
        return
    import triton
    with _CACHE_KNOB_LOCK, triton.knobs.cache.scope():
        triton.knobs.cache.dir = os.path.join(cache_dir, "triton")
        yield


def entry_param_count(ptx: str, name: str) -> int:
    """Parameters of the kernel's entry in its PTX (Triton appends scratch pointers to the user's)."""
    entry = re.search(rf"\.entry\s+{re.escape(name)}\s*\((.*?)\)", ptx, flags=re.S)
    if entry is None:
        raise CudaError(f"no entry {name} in the PTX")
    return len(re.findall(r"\.param\b", entry.group(1)))


# ------------------------------------------------------------------ kept on disk: a folder per variant


def write_kept(folder: str, fields: dict) -> None:
    """Writes a binary's folder (its cubin and launch facts) whole, or not at all."""
    tmp = f"{folder}.{os.getpid()}.{threading.get_ident()}.tmp"
    cubin = fields["cubin"]
    try:
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, "kernel.cubin"), "wb") as f:
            f.write(cubin)
        meta = {"name": fields["name"], "num_warps": fields["num_warps"], "shared": fields["shared"],
                "arg_kinds": list(fields["arg_kinds"]), "extra_params": fields["extra_params"],
                "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
        with open(os.path.join(tmp, "launch.json"), "w") as f:
            json.dump(meta, f)
        os.replace(tmp, folder)  # a reader sees the whole folder or none
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process may have written it first


def read_kept(folder: str) -> dict | None:
    """A kept binary's fields, or None where there is none (a damaged one is removed, with a warning)."""
    try:
        with open(os.path.join(folder, "launch.json")) as f:
            meta = json.load(f)
        with open(os.path.join(folder, "kernel.cubin"), "rb") as f:
            cubin = f.read()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("smelt: ignoring kept kernel %s (%s); compiling it again", folder, e)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        log.warning("smelt: kept kernel %s does not match its hash; compiling it again", folder)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return {"name": meta["name"], "cubin": cubin, "num_warps": meta["num_warps"], "shared": meta["shared"],
            "arg_kinds": tuple(meta["arg_kinds"]), "extra_params": meta["extra_params"]}
