"""Writes a combo kernel's pointer table on the GPU with a kernel whose arguments are the table's values.

A combo kernel (codegen/triton/combo.py) reads its members' buffer addresses from a table in device
memory, which must be written again when buffers the graph allocates move. Built on the host, a
table took a list, pinned staging memory with its event, a fresh device tensor and a copy: in BERT's
AMP training step 50 tables a step, 2.9 ms of host time on the H200 host. A launch takes its parameters by value
when it is made, so a tiny kernel given the table's values as its arguments writes them in stream
order, before the combo kernel reads them, into a table that stays where it is: one launch through
the C launcher, no host memory that must outlive the call. (In that step no table is written after the
first steps: the buffers come back to the same addresses, which they did not while each call
allocated its tables; why, not examined.)

One writer per size: WIDTHS values, padded with zeros. A table longer than the widest is written
in pieces, each into a view of the table at its offset. Kernel parameters take at most 4 KB
(the table's pointer and Triton's two scratch pointers beside the values).
"""
from __future__ import annotations

import functools

import torch

WIDTHS = (16, 64, 256, 480)


def writer_source(width: int) -> str:
    values = ", ".join(f"v{i}" for i in range(width))
    stores = "\n".join(f"    tl.store(table + {i}, v{i})" for i in range(width))
    return (f"import triton\nimport triton.language as tl\n\n\n"
            f"@triton.jit\ndef write_pointer_table_{width}(table, {values}):\n"
            f"    # a combo kernel's pointer table, from the launch's arguments (runtime/table_writer.py)\n"
            f"{stores}\n")


def writer_spec(width: int) -> tuple:
    """The writer's arguments as cuda_binary.describe gives them: no value is specialized on."""
    return (("ptr", "torch.int64", True),) + (("i64", False),) * width


def ahead_jobs(count: int, cache_dir: str, capability) -> list[dict]:
    """Compile-pool jobs (triton_loading.build_ahead) for the writers of a table of `count` values."""
    from .kernel_binaries import folder_for, variant_key
    from .loader import source_path
    from .triton_cubin import CUDA_COMPILE_OPTIONS
    jobs = []
    for width in set(widths(count)):
        name, source = f"write_pointer_table_{width}", writer_source(width)
        jobs.append({"backend": "triton", "name": name, "path": source_path(cache_dir, name, source),
                     "spec": writer_spec(width), "constexprs": {}, "num_warps": 1, "capability": list(capability),
                     "options": dict(CUDA_COMPILE_OPTIONS), "cache_dir": cache_dir,
                     "folder": folder_for(cache_dir, variant_key(source, writer_spec(width), {}, 1, capability))})
    return jobs


def widths(count: int) -> list[int]:
    """The writers a table of `count` values is written with, piece by piece."""
    return [width_for(min(WIDTHS[-1], count - start)) for start in range(0, count, WIDTHS[-1])]


def table_length(count: int) -> int:
    """Elements a table of `count` values needs, with its last piece's padding."""
    pieces = widths(count)
    return (len(pieces) - 1) * WIDTHS[-1] + pieces[-1] if pieces else 0


def width_for(count: int) -> int:
    """The narrowest writer that takes `count` values (the widest for longer tables: written in pieces)."""
    return next((w for w in WIDTHS if w >= count), WIDTHS[-1])


class TableWriter:
    """The writers of one cache folder, compiled on first use (and kept there with the kernels)."""

    def __init__(self, cache_dir: str | None, interpret: bool):
        self.cache_dir = cache_dir
        self.interpret = interpret  # CPU tables under Triton's interpreter (the tests' path)
        self._fns: dict[int, object] = {}
        self._binaries: dict[tuple[int, int], object] = {}

    def _fn(self, width: int):
        fn = self._fns.get(width)
        if fn is None:
            import tempfile

            from .loader import load_module, source_path
            folder = self.cache_dir or tempfile.gettempdir()
            path = source_path(folder, f"write_pointer_table_{width}", writer_source(width))
            fn = self._fns[width] = getattr(load_module(path, interpret=self.interpret), f"write_pointer_table_{width}")
        return fn

    def _binary(self, width: int, device: int):
        binary = self._binaries.get((width, device))
        if binary is None:
            from .kernel_binaries import KernelVariants
            spec = writer_spec(width)
            variants = KernelVariants(self._fn(width), writer_source(width), self.cache_dir)
            binary = variants.load_or_compile(spec, {}, 1, torch.cuda.get_device_capability(device))
            binary.load(device)
            self._binaries[(width, device)] = binary
        return binary

    def prepare(self, count: int, device: torch.device) -> None:
        """Builds the writers a table of `count` values needs (raises where one does not build)."""
        for width in set(widths(count)):
            if self.interpret:
                self._fn(width)
            else:
                self._binary(width, device.index)

    def write(self, table: torch.Tensor, values: list[int]) -> None:
        """Writes `values` into `table` (int64, at least width_for(len(values)) long past each
        piece's offset) on the current stream."""
        widest = WIDTHS[-1]
        for start in range(0, len(values), widest):
            piece = values[start:start + widest]
            width = width_for(len(piece))
            args = (table[start:] if start else table, *piece, *(0,) * (width - len(piece)))
            if self.interpret:
                self._fn(width)[(1,)](*args)
                continue
            device = table.device.index
            self._binary(width, device).launch((1,), args, device)


@functools.lru_cache(maxsize=None)
def writer_for(cache_dir: str | None, interpret: bool = False) -> TableWriter:
    return TableWriter(cache_dir, interpret)
