"""Launches one generated Triton kernel: grid from the element count, block sizes fixed at codegen.

A GPU kernel is compiled by smelt for each distinct description of its arguments and launched
through the CUDA driver (cuda_binary.py, kernel_binaries.py): no host-compiler builds on the first
launch, and kept binaries let a later process launch without compiling. Where that path does not
apply (arguments it does not describe, a kernel needing scratch memory, another GPU vendor), and
for CPU kernels under the interpreter, Triton's JIT launches the kernel.

A kernel gets one program per XBLOCK of x; a tiled one, one per XBLOCK x RBLOCK tile, on a 2-D
(or, past the grid's axis-1 limit, 3-D) grid laid out as its source expects.
"""
from __future__ import annotations

import collections
import copy
import logging
import operator
import threading
from typing import Callable

import torch
import triton

from ..artifact import grid_for
from ..errors import KernelCompileError
from .cuda_binary import CUDA_COMPILE_OPTIONS, CudaError
from .kernel_binaries import KernelVariants, Unsupported
from .loader import resolved
from .workspaces import RowSplitWorkspace, TicketCounter

log = logging.getLogger("smelt.runtime")

MAX_RESOLVED = 16  # distinct scalar sets remembered per kernel (dynamic sizes); past it, resolve each call


class TritonLauncher:
    def __init__(self, fn, name: str, path: str, origins: list[str], config, interpret: bool, xnumel_arg: int,
                 workspace: tuple[int, int, int] | None = None, autotuner=None,
                 variants: KernelVariants | None = None, ticket: bool = False, programs: int | None = None,
                 cuda_check=None, options: dict = CUDA_COMPILE_OPTIONS, constants: dict | None = None):
        self.fn = fn
        self.constants = constants or {}  # constexprs over those of block_constants
        self.programs = programs  # a fixed grid (a combo kernel's), else one program per XBLOCK of x
        self.xnumel_arg = xnumel_arg  # position of xnumel among the kernel's arguments (rnumel follows)
        self.name = name
        self.path = path
        self.origins = origins
        self.interpret = interpret
        self.row_split = workspace[0] if workspace is not None else None
        # Several programs per row meet through a sync buffer (row split kernels are never tuned).
        self.workspace = RowSplitWorkspace(*workspace, config.XBLOCK) if workspace is not None else None
        self.tickets = TicketCounter() if ticket else None  # its last program runs a finisher
        self.autotuner = autotuner
        self._tuning = threading.Lock()
        self.launched = False
        self.variants = variants if not interpret else None  # None: Triton's JIT launches
        # SMELT_CHECK_CUDA_COMPILE: compiles the kernel's CUDA form for each new argument description.
        self.cuda_check = cuda_check
        self.options = options  # Triton's compile options (triton_cubin.compile_options), for the JIT
        # Launches already resolved (binary, grid, appended buffers), by the call's scalars: see _recall_key.
        # A tuned kernel's too: its config is chosen per sizes, which are among those scalars. (Without
        # it every call of a tuned kernel went the whole way; under SMELT_AUTOTUNE=1 EfficientNet's bf16
        # inference took 5.06 ms a call against 2.08 untuned on the H200; with it none of its 98 tuned
        # kernels takes the whole path after the first call.)
        self._resolved: dict | None = {} if self.variants is not None else None
        self._tensors = self._scalars = None  # itemgetters over a call's arguments, set on its first
        self._use(config)

    def _use(self, config) -> None:
        self.config = config
        self.constexprs = {**block_constants(config, self.programs is not None, self.row_split), **self.constants}
        self.block_constants = dict(self.constexprs)
        if not self.interpret:  # the interpreter takes no launch options
            self.constexprs.update(num_warps=config.num_warps, **self.options)

    def reconfigure(self, config, programs: int) -> None:
        """A combo kernel's new launch config and grid (runtime/combo_launcher.py tunes them)."""
        if config == self.config and programs == self.programs:
            return
        self.programs = programs
        self._use(config)
        if self._resolved is not None:
            self._resolved.clear()

    def with_constants(self, **constants) -> "TritonLauncher":
        """This kernel launched with other constexprs (and its own memory of resolved launches)."""
        twin = copy.copy(self)
        twin.constants = {**self.constants, **constants}
        twin._tuning = threading.Lock()
        twin._resolved = {} if self.variants is not None else None
        twin._use(self.config)
        return twin

    def __call__(self, *args):
        key = None
        if self._resolved is not None:
            key = self._recall_key(args)
            hit = self._resolved.get(key)
            if hit is not None:
                binary, grid, extra, device = hit
                try:
                    if binary.launch(grid, (*args, *extra) if extra else args, device, aligned=True):
                        return
                except CudaError as e:
                    raise self._failed(e) from e
            if hit is not None or not self._aligned(args):
                key = None  # a misaligned pointer: the full path picks its binary, not remembered
        if self.autotuner is not None:
            # The chosen config is this launcher's state from the pick to the launch: a thread
            # launching other sizes meanwhile would mix one config's grid with another's binary.
            with self._tuning:
                return self._resolve_and_launch(args, key)
        return self._resolve_and_launch(args, key)

    def _resolve_and_launch(self, args, key) -> None:
        plain = args
        if self.programs is not None:
            grid = (self.programs,)
        else:
            xnumel = args[self.xnumel_arg]
            if xnumel == 0:
                return
            if self.autotuner is not None:
                sizes = tuple(a for a in args if isinstance(a, int))
                trial = []  # the trials' arguments, made at the first trial

                def run(config, args=args):
                    trial[:] = trial or [_apart(args)]
                    self._launch_with(config, trial[0])
                config = self.autotuner.pick(sizes, _device_of(args), run)
                if config != self.config:
                    self._use(config)
            if self.workspace is not None:
                args = (*args, *self.workspace.buffers(xnumel, _device_of(args)))
                grid = (self.workspace.grid(xnumel),)
            else:
                grid = self.grid(args)
                if 0 in grid:
                    return
                if self.tickets is not None:
                    args = (*args, self.tickets.buffer(_device_of(args)))
        if self.cuda_check is not None:
            self.cuda_check(plain)
        binary = self._launch(grid, args)
        if key is not None and binary is not None and len(self._resolved) < MAX_RESOLVED:
            self._resolved[key] = (binary, grid, args[len(plain):], _device_of(args).index)

    def _recall_key(self, args):
        """What a resolved launch of these arguments is found by. The binary depends on dtypes
        (fixed by the graph and Dynamo's guards), 16-byte alignment and the integers; the grid, the
        buffers and an autotuner's choice on the integers. So: the integers (a host scalar's float,
        whose kind is fixed by the wrapper, may change every call). Only launches with every pointer
        aligned are remembered, and the binary's launch checks the pointers (CudaBinary.launch's
        `aligned`)."""
        if self._tensors is None:
            tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            scalars = [i for i, a in enumerate(args) if isinstance(a, int)]
            self._tensors, self._scalars = items_getter(tensors), items_getter(scalars)
        return self._scalars(args)

    def _aligned(self, args) -> bool:
        bits = 0
        for tensor in self._tensors(args):
            bits |= tensor.data_ptr()
        return not bits & 15

    def _launch_with(self, config, args) -> None:
        self._use(config)
        self._launch(self.grid(args), args)

    def grid(self, args) -> tuple[int, ...]:
        config = self.config
        x_programs = -(-args[self.xnumel_arg] // config.XBLOCK)
        if config.tiles is None:
            return (x_programs,)
        programs = {"x": x_programs, "r": -(-args[self.xnumel_arg + 1] // config.RBLOCK)}
        return grid_for(*(programs[axis] for axis in config.tiles.grid_axes))

    def _launch(self, grid, args):
        """Launches; returns the CudaBinary it used, or None where Triton's JIT launched."""
        if self.variants is not None:
            device = _device_of(args).index
            try:
                binary = self.variants.binary(args, self.block_constants, self.config.num_warps, device)
            except triton.CompilationError as e:
                raise self._failed(e) from e
            except (Unsupported, CudaError, ImportError, AttributeError, TypeError, KeyError) as e:
                # A Triton whose compile API differs, or a kernel this path cannot launch.
                log.warning("smelt: %s launches through Triton's JIT (%s: %s)", self.name, type(e).__name__, e)
                self.variants = None
            else:
                try:
                    binary.launch(grid, args, device)
                except CudaError as e:
                    raise self._failed(e) from e
                self.launched = True
                return binary
        fn = resolved(self.fn)
        try:
            fn[grid](*args, **self.constexprs)
        except Exception as e:
            if self.launched and not isinstance(e, triton.CompilationError):
                raise
            raise self._failed(e) from e
        self.launched = True
        return None

    def _failed(self, e: Exception) -> KernelCompileError:
        return KernelCompileError(
            f"smelt: kernel {self.name} failed to compile or launch; source: {self.path}; "
            f"from ATen ops: {', '.join(self.origins)}; error: {error_text(e)}")

    def __repr__(self):
        return f"<{self.name} from {self.path}>"


def error_text(e: Exception) -> str:
    """The error's type and message; for a Triton compile error, led by the line Triton failed at and
    why, on one line. The outer error of a failure inside a function the kernel calls (a combo
    kernel's body, a finisher) shows only the call, and the reason comes last, after the source."""
    text = f"{type(e).__name__}: {e}"
    chain = [e]
    while len(chain) < 16 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    failures = [x for x in chain if isinstance(x, triton.CompilationError)]
    if not failures:
        return text
    inner, root = failures[-1], chain[-1]
    lines = str(inner.src or "").split("\n")
    at = getattr(inner.node, "lineno", 0)
    line = lines[at - 1].strip() if 0 < at <= len(lines) else "?"
    # The exception under Triton's (a libdevice dispatch's KeyError) names what failed best.
    reason = f"{type(root).__name__}: {root}" if root is not inner else (inner.error_message or "")
    return f"{type(inner).__name__} at `{line}`: {' '.join(reason.split())[:500]}\n{text}"


def block_constants(config, fixed_grid: bool, row_split: int | None) -> dict:
    """The constexpr arguments of a launch. A combo kernel (fixed grid) takes only its pointwise
    kinds' XBLOCK (its reduction kinds' blocks are in its source) and POINTER_ALIGN, 16 here: the
    binary for buffers all 16-byte aligned (runtime/combo_launcher.py launches another for the rest)."""
    constants = {"XBLOCK": config.XBLOCK}
    if fixed_grid:
        constants["POINTER_ALIGN"] = 16
    if not fixed_grid and config.RBLOCK is not None:
        constants["RBLOCK"] = config.RBLOCK
    if row_split is not None:
        constants["ROW_SPLIT"] = row_split
    return constants


# The buffers a launch appends to the wrapper's arguments, described as cuda_binary.describe would:
# int32 sync counters and float32 partials of a row split (RowSplitWorkspace.buffers), a
# finisher's int32 ticket (TicketCounter.buffer).
_ROW_SPLIT_BUFFERS = (("ptr", "torch.int32", True), ("ptr", "torch.float32", True))
_TICKET = (("ptr", "torch.int32", True),)


def appended_description(workspace, ticket: bool) -> tuple:
    """describe() of what a launch of a kernel with this row-split workspace and ticket appends."""
    return (_ROW_SPLIT_BUFFERS if workspace is not None else ()) + (_TICKET if ticket else ())


def items_getter(positions) -> Callable:
    """A tuple of the arguments at `positions`, whatever their number."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        (only,) = positions
        return lambda args: (args[only],)
    return operator.itemgetter(*positions)


def _apart(args) -> tuple:
    """args for a tuner's trial launches, with each tensor that shares memory with another argument
    copied (same strides): an output the memory plan put over its own kernel's dying input
    (scheduler/reuse.py) would make every launch after the first read what the last one wrote."""
    def memory(a):
        return a.untyped_storage().data_ptr() if isinstance(a, torch.Tensor) else None
    counts = collections.Counter(memory(a) for a in args)
    if all(n == 1 for ptr, n in counts.items() if ptr is not None):
        return args
    return tuple(torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device).copy_(a)
                 if memory(a) is not None and counts[memory(a)] > 1 else a for a in args)


def _device_of(args):
    return next(a.device for a in args if isinstance(a, torch.Tensor))
