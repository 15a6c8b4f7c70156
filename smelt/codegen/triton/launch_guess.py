"""What a kernel's launch arguments will be, guessed at codegen so that its GPU binary can be
compiled before the first call (runtime/triton_loading.build_ahead).

The wrapper passes a kernel its buffers, then its size symbols and host scalars, xnumel and rnumel. A GPU binary is
specialized on each pointer's dtype and 16-byte alignment and each integer's width and
divisibility by 16 (runtime/cuda_binary.describe). Codegen knows all of that but the alignment of
memory it does not allocate (inputs, ATen's results), which is nearly always aligned: a guess that
turns out wrong costs only the compile the launch would have made anyway.
"""
from __future__ import annotations

from ...symbolic import static_int

INT32 = (-2**31, 2**31)


def launch_guess(kernel, graph) -> tuple | None:
    """The describe() of the arguments the wrapper will pass `kernel` (a TritonKernelSource), or
    None where a size is only known at run time."""
    host_scalars = set(graph.host_scalars.values())
    if any(arg not in host_scalars for arg in kernel.size_args):
        return None
    slices = {b.name: b.lives_in for b in graph.buffers if getattr(b, "lives_in", None)}
    spec = []
    for _, name in kernel.params:
        dtype = graph.dtype_of(name)
        aligned = True
        if name in slices:  # a slice of a storage the wrapper allocates: aligned where its offset is
            offset = static_int(slices[name][1])
            aligned = offset is not None and offset * dtype.itemsize % 16 == 0
        spec.append(("ptr", str(dtype), aligned))
    spec += [("fp64",)] * len(kernel.size_args)  # each a HostDouble
    for count in (kernel.xnumel, kernel.rnumel):
        if count is None:
            continue
        value = static_int(count)
        if value is None:
            return None
        spec.append(("i32" if INT32[0] <= value < INT32[1] else "i64", value % 16 == 0))
    return tuple(spec)
