"""Errors smelt raises, each naming the op, shape, kernel or setting at fault."""


class SmeltError(RuntimeError):
    pass


class LoweringError(SmeltError):
    """An ATen op could not be turned into IR; the message names the op and its inputs."""


class KernelCompileError(SmeltError):
    """A generated kernel did not compile; the message names the kernel, its source file and ATen ops."""


class HalideRefusedKernel(KernelCompileError):
    """Halide did not compile a kernel smelt generated; the graph is generated again with that kernel
    in Triton (pipeline.compile_graph)."""

    def __init__(self, message: str, kernel: str):
        super().__init__(message)
        self.kernel = kernel
