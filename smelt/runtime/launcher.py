"""Launches one generated Triton kernel: grid from the element count, block sizes fixed at codegen.

The first launch goes through Triton's JIT, which compiles (or loads from its disk cache) a
binary specialized on the arguments: integers equal to 1 or divisible by 16, pointers aligned to
16 bytes, 32- or 64-bit integers. Later launches whose arguments have the same specialization
call that binary directly, which skips the JIT's argument binding and cache lookup (tens of
microseconds a launch, enough to leave the GPU idle between small kernels). With a kept-kernels
folder, the binaries are also kept on disk (kernel_binaries.py), and a later process launches
them without going through the JIT at all.

A kernel gets one program per XBLOCK of x; a tiled one, one per XBLOCK x RBLOCK tile, on a 2-D
(or, past the grid's axis-1 limit, 3-D) grid laid out as its source expects.
"""
from __future__ import annotations

import torch
import triton

from ..codegen.tiling import grid_for
from ..codegen.triton_row_split import RowSplitWorkspace
from ..errors import KernelCompileError
from .kernel_binaries import KeptKernels


class TritonLauncher:
    def __init__(self, fn, name: str, path: str, origins: list[str], config, interpret: bool, xnumel_arg: int,
                 workspace: tuple[int, int, int] | None = None, autotuner=None, kept: KeptKernels | None = None):
        self.fn = fn
        self.xnumel_arg = xnumel_arg  # position of xnumel among the kernel's arguments (rnumel follows)
        self.name = name
        self.path = path
        self.origins = origins
        self.interpret = interpret
        self.row_split = workspace[0] if workspace is not None else None
        # Several programs per row meet through a sync buffer (row split kernels are never tuned).
        self.workspace = RowSplitWorkspace(*workspace, config.XBLOCK) if workspace is not None else None
        self.autotuner = autotuner
        self.launched = False
        self.binaries: dict[tuple, object] | None = {}
        self.kept = kept if not interpret else None  # binaries kept on disk for later processes
        self._use(config)

    def _use(self, config) -> None:
        self.config = config
        self.constexprs = {"XBLOCK": config.XBLOCK}
        if config.RBLOCK is not None:
            self.constexprs["RBLOCK"] = config.RBLOCK
        if self.row_split is not None:
            self.constexprs["ROW_SPLIT"] = self.row_split
        # Constexpr values in the kernel's parameter order, for calling a compiled binary directly.
        self.constexpr_values = list(self.constexprs.values())
        if not self.interpret:  # the interpreter takes no launch options
            self.constexprs["num_warps"] = config.num_warps
        if self.binaries is not None:
            self.binaries = {}

    def __call__(self, *args):
        xnumel = args[self.xnumel_arg]
        if xnumel == 0:
            return
        if self.autotuner is not None:
            sizes = tuple(a for a in args if isinstance(a, int))
            config = self.autotuner.pick(sizes, _device_of(args), lambda c: self._launch_with(c, args))
            if config != self.config:
                self._use(config)
        if self.workspace is not None:
            args = (*args, *self.workspace.buffers(xnumel, _device_of(args)))
            grid = (self.workspace.grid(xnumel),)
        else:
            grid = self.grid(args)
            if 0 in grid:
                return
        self._launch(grid, args)

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

    def _launch(self, grid, args) -> None:
        if self.binaries is not None and not self.interpret:
            key = _specialization(args)
            binary = self.binaries.get(key)
            if binary is None and self.kept is not None:
                binary = self.kept.load(args, self.constexprs, self.constexpr_values)
                if binary is not None:
                    self.binaries[key] = binary
            if binary is not None:
                try:
                    binary[(*grid, 1, 1)[:3]](*args, *self.constexpr_values)
                    return
                except TypeError:  # a Triton whose binaries take other arguments: use the JIT
                    self.binaries = None
        try:
            compiled = self.fn[grid](*args, **self.constexprs)
            if self.binaries is not None and not self.interpret and _can_launch_directly(compiled):
                self.binaries[key] = compiled
                if self.kept is not None:
                    self.kept.save(args, self.constexprs, compiled)
        except Exception as e:
            if self.launched and not isinstance(e, triton.CompilationError):
                raise
            raise KernelCompileError(
                f"smelt: kernel {self.name} failed to compile or launch; source: {self.path}; "
                f"from ATen ops: {', '.join(self.origins)}; error: {type(e).__name__}: {e}") from e
        self.launched = True

    def __repr__(self):
        return f"<{self.name} from {self.path}>"


def _device_of(args):
    return next(a.device for a in args if isinstance(a, torch.Tensor))


def _specialization(args) -> tuple:
    """What Triton's JIT specializes a binary on, for each argument."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(a.data_ptr() % 16 == 0)
        elif isinstance(a, int):
            key.append((a == 1, a % 16 == 0, -2**31 <= a < 2**31))
        else:
            key.append(type(a))
    return tuple(key)


def _can_launch_directly(compiled) -> bool:
    return hasattr(type(compiled), "__getitem__") and hasattr(compiled, "run")
