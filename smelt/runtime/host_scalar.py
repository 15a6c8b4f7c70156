"""A CPU scalar input's value as a kernel argument (Target.host_scalar_args)."""


class HostDouble(float):
    """A float a kernel takes as float64: cuda_binary.describe gives it ("fp64",), where a plain
    Python float is passed as float32 (Triton's own choice for one)."""

    __slots__ = ()
