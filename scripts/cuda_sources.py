"""Print the Triton kernels smelt would generate for a workload on CUDA, on a machine without a GPU.

    python scripts/cuda_sources.py cross_entropy [var_mean ...]

The workload's inputs are made on the CPU at their full benchmark size, and every kernel is
generated as for a GPU (block sizes, row split, no interpreter stand-ins); nothing is launched.
Use it to read what a GPU run will execute before spending device time on it.
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, ".")

import smelt  # noqa: E402,F401
from smelt import pipeline  # noqa: E402
from smelt.codegen.triton import backend as triton_backend  # noqa: E402
from benchmarks.workloads import by_name  # noqa: E402


class _Generated(Exception):
    def __init__(self, generated):
        self.generated = generated


def _generate_as_cuda(step, graph, interpret, cfg, index):
    return _generate_kernel(step, graph, False, cfg, index)


def _stop_after_codegen(generated, cache_dir, keep):
    raise _Generated(generated)


_generate_kernel = triton_backend.generate_kernel
triton_backend.generate_kernel = _generate_as_cuda
pipeline.assemble = _stop_after_codegen


def show(name: str) -> None:
    (workload,) = by_name(name)
    inputs = workload.make_inputs("cpu", small=False)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(workload.fn, backend="smelt")(*inputs)
    except Exception as exc:  # Dynamo wraps the backend's exception
        while exc is not None and not isinstance(exc, _Generated):
            exc = exc.__cause__ or getattr(exc, "inner_exception", None)
        if exc is None:
            raise
        generated = exc.generated
        print(f"===== {name}: {len(generated.kernels)} kernel(s)")
        print(generated.wrapper_source)
        for kernel in generated.kernels:
            print(f"----- {kernel.name}")
            print(kernel.source)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        show(arg)
