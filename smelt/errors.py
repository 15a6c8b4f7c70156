"""Errors smelt raises, each naming the op, shape, kernel or setting at fault."""


class SmeltError(RuntimeError):
    pass


class LoweringError(SmeltError):
    """An ATen op could not be turned into IR; the message names the op and its inputs."""


class KernelCompileError(SmeltError):
    """A generated kernel did not compile; the message names the kernel, its source file and ATen ops."""
