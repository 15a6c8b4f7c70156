"""Launches one generated Triton kernel: grid from the element counts, block sizes fixed at codegen.

A kernel gets one program per XBLOCK of x; a tiled one, one per XBLOCK x RBLOCK tile, on a 2-D
(or, past the grid's axis-1 limit, 3-D) grid laid out as its source expects.
"""
from __future__ import annotations

import triton

from ..codegen.tiling import grid_for
from ..errors import KernelCompileError


class TritonLauncher:
    def __init__(self, fn, name: str, path: str, origins: list[str], config, interpret: bool, xnumel_arg: int):
        self.fn = fn
        self.xnumel_arg = xnumel_arg  # position of xnumel among the kernel's arguments (rnumel follows)
        self.name = name
        self.path = path
        self.origins = origins
        self.xblock = config.XBLOCK
        self.rblock = config.RBLOCK
        self.tile_axes = config.tiles.grid_axes if config.tiles is not None else None
        self.constexprs = {"XBLOCK": config.XBLOCK}
        if config.RBLOCK is not None:
            self.constexprs["RBLOCK"] = config.RBLOCK
        if not interpret:  # the interpreter takes no launch options
            self.constexprs["num_warps"] = config.num_warps
        self.launched = False

    def __call__(self, *args):
        grid = self.grid(args)
        if 0 in grid:
            return
        try:
            self.fn[grid](*args, **self.constexprs)
        except Exception as e:
            if self.launched and not isinstance(e, triton.CompilationError):
                raise
            raise KernelCompileError(
                f"smelt: kernel {self.name} failed to compile or launch; source: {self.path}; "
                f"from ATen ops: {', '.join(self.origins)}; error: {type(e).__name__}: {e}") from e
        self.launched = True

    def grid(self, args) -> tuple[int, ...]:
        x_programs = -(-args[self.xnumel_arg] // self.xblock)
        if self.tile_axes is None:
            return (x_programs,)
        programs = {"x": x_programs, "r": -(-args[self.xnumel_arg + 1] // self.rblock)}
        return grid_for(*(programs[axis] for axis in self.tile_axes))

    def __repr__(self):
        return f"<{self.name} from {self.path}>"
