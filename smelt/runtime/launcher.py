"""Launches one generated Triton kernel: grid from the element count, block sizes fixed at codegen."""
from __future__ import annotations

import torch
import triton

from ..codegen.triton_row_split import RowSplitWorkspace
from ..errors import KernelCompileError


class TritonLauncher:
    def __init__(self, fn, name: str, path: str, origins: list[str], config, interpret: bool, xnumel_arg: int,
                 workspace: tuple[int, int, int] | None = None):
        self.fn = fn
        self.xnumel_arg = xnumel_arg  # position of xnumel among the kernel's arguments
        self.name = name
        self.path = path
        self.origins = origins
        self.xblock = config.XBLOCK
        self.constexprs = {"XBLOCK": config.XBLOCK}
        if config.RBLOCK is not None:
            self.constexprs["RBLOCK"] = config.RBLOCK
        if not interpret:  # the interpreter takes no launch options
            self.constexprs["num_warps"] = config.num_warps
        self.launched = False
        self.workspace = None
        if workspace is not None:  # several programs per row: they meet through a sync buffer
            self.workspace = RowSplitWorkspace(*workspace, config.XBLOCK)
            self.constexprs["ROW_SPLIT"] = workspace[0]

    def __call__(self, *args):
        grid = ((args[self.xnumel_arg] + self.xblock - 1) // self.xblock,)
        if grid[0] == 0:
            return
        if self.workspace is not None:
            device = next(a.device for a in args if isinstance(a, torch.Tensor))
            args = (*args, *self.workspace.buffers(args[self.xnumel_arg], device))
            grid = (self.workspace.grid(args[self.xnumel_arg]),)
        try:
            self.fn[grid](*args, **self.constexprs)
        except Exception as e:
            if self.launched and not isinstance(e, triton.CompilationError):
                raise
            raise KernelCompileError(
                f"smelt: kernel {self.name} failed to compile or launch; source: {self.path}; "
                f"from ATen ops: {', '.join(self.origins)}; error: {type(e).__name__}: {e}") from e
        self.launched = True

    def __repr__(self):
        return f"<{self.name} from {self.path}>"
