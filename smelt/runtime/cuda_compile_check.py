"""SMELT_CHECK_CUDA_COMPILE: every kernel run by Triton's interpreter is also compiled for an H100.

The interpreter runs a kernel as numpy calls, so it accepts code that Triton's GPU compiler
refuses: a libdevice call on a float64 tensor and a float32 literal has no overload, a name bound
to two types in two branches is rejected. A CPU run alone therefore does not show that a graph
builds on the GPU. With the setting on, code generation also writes each interpreted kernel's
CUDA form (smelt/artifact.py's CudaTwin: the same step generated with interpret=False), and at
each launch with a new argument description (cuda_binary.describe: dtypes, alignment, integer
widths) that form is compiled for sm_90 through smelt's own GPU compile path, which needs no GPU.
A kernel Triton cannot compile raises KernelCompileError, as its first launch on the GPU would.

Each (source, argument description, blocks) is compiled once per process; where the graph cache
is on, the binary is kept on disk like a GPU kernel's, so a later process skips the compile.

The check needs TRITON_INTERPRET unset: smelt interprets its CPU kernels itself, and with the knob
on when Triton is imported, triton.language's own @jit helpers (the sum and max combines every
reduction calls) are made interpreter-only, so every CUDA compile of a reduction would fail.
"""
from __future__ import annotations

import hashlib

from ..artifact import CudaTwin
from ..errors import KernelCompileError, SmeltError
from . import interpreter_compat
from .cuda_binary import describe
from .kernel_binaries import KernelVariants, Unsupported
from .launcher import appended_description, block_constants, error_text
from .loader import load_module

CAPABILITY = (9, 0)  # the H100, where smelt's GPU runs are made

# (source digest, argument description, block constants, warps) -> the error, or None: compiled.
_outcomes: dict[tuple, KernelCompileError | None] = {}


def _refuse_interpreted_triton_library() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    if isinstance(getattr(tl.standard, "_sum_combine", None), InterpretedFunction):
        raise SmeltError(
            "smelt: SMELT_CHECK_CUDA_COMPILE cannot compile for CUDA in a process that imported Triton with "
            "TRITON_INTERPRET=1 (triton.language's own helpers are then interpreter-only); unset TRITON_INTERPRET: "
            "smelt runs CPU kernels through the interpreter without it")


class CudaCompileCheck:
    def __init__(self, twin: CudaTwin, path: str, origins: list[str], cache_dir: str | None):
        _refuse_interpreted_triton_library()
        self.twin = twin
        self.path = path  # the CUDA form's source file, named in the error
        self.origins = origins
        self.cache_dir = cache_dir  # None: binaries are not kept
        row_split = twin.workspace[0] if twin.workspace is not None else None
        self.constexprs = block_constants(twin.config, twin.combo, row_split)
        self.extra = appended_description(twin.workspace, twin.ticket)
        self.digest = hashlib.sha256(twin.source.encode()).hexdigest()
        self._variants: KernelVariants | None = None

    def __call__(self, args) -> None:
        """Compiles the CUDA form for these launch arguments (the interpreted kernel's, without the
        buffers its launcher appends) unless done before; raises KernelCompileError where it fails."""
        spec = describe(args)
        if spec is None:  # arguments smelt's GPU path does not describe: Triton's JIT would compile them
            return
        spec += self.extra
        key = (self.digest, spec, tuple(sorted(self.constexprs.items())), self.twin.config.num_warps)
        if key not in _outcomes:
            _outcomes[key] = self._compile(spec)
        error = _outcomes[key]
        if error is not None:
            raise error

    def _compile(self, spec: tuple) -> KernelCompileError | None:
        try:
            with interpreter_compat.LOCK:  # not while another thread's interpreted launch patches triton.language
                self._kernel_variants().load_or_compile(spec, self.constexprs, self.twin.config.num_warps, CAPABILITY)
        except Unsupported:  # compiled, but launched through Triton's JIT on the GPU (scratch memory, ...)
            return None
        except Exception as e:  # on the GPU, any compile failure fails the kernel's first launch
            return KernelCompileError(
                f"smelt: kernel {self.twin.name} failed to compile for CUDA sm_{CAPABILITY[0]}{CAPABILITY[1]} "
                f"(SMELT_CHECK_CUDA_COMPILE); source: {self.path}; from ATen ops: {', '.join(self.origins)}; "
                f"error: {error_text(e)}")
        return None

    def _kernel_variants(self) -> KernelVariants:
        if self._variants is None:
            module = load_module(self.path, interpret=False)  # compiled @triton.jit functions, whatever the knob says
            self._variants = KernelVariants(getattr(module, self.twin.name), self.twin.source, self.cache_dir)
        return self._variants
