"""Launches a compiled Halide pipeline on torch CPU tensors, without copies.

Each tensor is described to Halide as a one-dimensional `halide_buffer_t` over its storage from
its first element (the kernel's index expressions hold the strides), pointing at the tensor's
own memory: views, storage offsets and bfloat16 (which numpy lacks) need nothing special. The
pipeline is called through its `<exported name>_argv` entry point with ctypes: buffers, then the sizes as
int32, then the output buffers.
"""
from __future__ import annotations

import _ctypes
import ctypes
import logging
import threading
import weakref

import torch

from ..errors import SmeltError
from .halide_compile import kernel_library, launch_header, runtime_library
from . import halide_threads

log = logging.getLogger("smelt.runtime")

INT32_MAX = 2 ** 31 - 1
# halide_type_t of each dtype as its C struct spells it: (code, bits). Codes: 0 int, 1 uint, 2 float, 4 bfloat.
HALIDE_TYPE_CODE = {
    torch.float32: (2, 32), torch.float64: (2, 64), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64), torch.uint8: (1, 8),
    torch.bool: (1, 1), torch.uint16: (1, 16), torch.uint32: (1, 32), torch.uint64: (1, 64),
}


# The same, packed as code | bits << 8 for launch_ext.c's halide_run.
_PACKED_TYPE_CODE = {dtype: code | bits << 8 for dtype, (code, bits) in HALIDE_TYPE_CODE.items()}


class HalideDimension(ctypes.Structure):
    _fields_ = [("min", ctypes.c_int32), ("extent", ctypes.c_int32), ("stride", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class HalideType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class HalideBuffer(ctypes.Structure):
    _fields_ = [("device", ctypes.c_uint64), ("device_interface", ctypes.c_void_p), ("host", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("type", HalideType), ("dimensions", ctypes.c_int32),
                ("dim", ctypes.POINTER(HalideDimension)), ("padding", ctypes.c_void_p)]


class HalideLaunchError(SmeltError):
    """A Halide pipeline stopped with an error (an index out of bounds, a buffer too large)."""


_ERROR_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
_errors = threading.local()
_runtimes: dict[str, object] = {}


@_ERROR_HANDLER
def _record_error(user_context, message):
    _errors.last = message.decode(errors="replace").strip()


def _install_error_handler(runtime_path: str) -> None:
    """Halide's runtime prints errors to stderr by default; smelt raises them instead."""
    if runtime_path in _runtimes:
        return
    lib = ctypes.CDLL(runtime_path)
    lib.halide_set_error_handler.restype = ctypes.c_void_p
    lib.halide_set_error_handler(_record_error)
    if halide_threads.wanted:
        halide_threads.share_torch_threads(lib, runtime_path)
    _runtimes[runtime_path] = lib


# The address given for an empty tensor: its data_ptr() is null (even a view of a real storage,
# as an expand to size 0), and a null host pointer makes the call a bounds query that computes
# nothing and returns success.
_EMPTY = ctypes.c_uint64(0)


def describes_empty(tensor: torch.Tensor, extent: int) -> bool:
    """Whether the placeholder stands in for the tensor's memory: it has no element to read."""
    return tensor.numel() == 0 or extent <= 0


def described_extent(k: int, num_inputs: int, empty: bool, extent: int) -> int:
    """The extent buffer k is described with. An empty input is read only in lanes a mask discards
    (a cat's empty piece, a pad of an empty tensor), but Halide's bounds check still wants the
    clamped address those lanes load from inside the buffer: it is one element of the placeholder."""
    if empty:
        return 1 if k < num_inputs else 0
    return extent


def storage_extent(kernel: str, tensor: torch.Tensor) -> int:
    """Elements from the tensor's first to the end of its storage: the kernel's index expressions
    may reach any of them (a view read through another layout)."""
    extent = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    if extent > INT32_MAX:
        raise HalideLaunchError(f"smelt: Halide kernel {kernel}: a buffer of {extent} elements is past "
                                f"Halide's int32 extents")
    return extent


class HalideLauncher:
    """Calls one kernel as `name(*input_buffers, *output_buffers, *sizes)`, like smelt's wrapper does.

    The argument structures are made once and refilled per call, so one launcher is not to be
    called from two threads at once.
    """

    # A CPU kernel's library is closed with its launcher: a process that compiles many graphs (the
    # fuzzer, ~13,000 kernels) otherwise reaches vm.max_map_count, 5 maps each, and every later
    # load fails ("mprotect failed"). Its code runs only inside a call (Halide's thread pool lives
    # in the shared runtime). The CUDA runtime keeps pointers into a kernel library: kept open.
    closes_library = True

    def __init__(self, name: str, source: str, origins: list[str], cache_dir: str, path: str | None = None,
                 header=None):
        self.name = name
        self.origins = origins
        self.path = path
        header = launch_header(name, source) if header is None else header
        self.num_inputs, self.num_outputs = len(header.INPUTS), len(header.OUTPUTS)
        self.size_names = header.SIZES
        self.xnumel_arg = self.num_inputs + self.num_outputs + self.size_names.index("xnumel")
        runtime, library, symbol, self.compile_seconds = self._compile(source, cache_dir)
        _install_error_handler(runtime)
        self.library = ctypes.CDLL(library)
        if self.closes_library:
            weakref.finalize(self, _ctypes.dlclose, self.library._handle)
        self.fn = getattr(self.library, f"{symbol}_argv")
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        # The pipeline has no asserts to check its buffers' types (halide_compile.kernel_target): the
        # launcher sets them once here and refuses a tensor of another dtype.
        self.dtypes = tuple(getattr(torch, d) for d in header.DTYPES)
        buffers = self.num_inputs + self.num_outputs
        self.dims = (HalideDimension * buffers)()
        self.buffers = (HalideBuffer * buffers)()
        for k in range(buffers):
            self.buffers[k].type.code, self.buffers[k].type.bits = HALIDE_TYPE_CODE[self.dtypes[k]]
            self.buffers[k].dimensions = 1
            self.buffers[k].dim = ctypes.pointer(self.dims[k])
            self.buffers[k].type.lanes = 1
            self.dims[k].stride = 1
        self.sizes = (ctypes.c_int32 * len(self.size_names))()
        self._describing = threading.RLock()  # re-entered by HalideCudaLauncher, which sets its stream under it
        # Halide's argument order: inputs, sizes, outputs.
        order = self._leading_arguments()
        order += [ctypes.addressof(self.buffers[k]) for k in range(self.num_inputs)]
        order += [ctypes.addressof(self.sizes) + 4 * k for k in range(len(self.size_names))]
        order += [ctypes.addressof(self.buffers[self.num_inputs + k]) for k in range(self.num_outputs)]
        self.argv = (ctypes.c_void_p * len(order))(*order)
        # The buffers described and the pipeline called in one call into C (launch_ext.c), where built.
        self.run = self._runner(cache_dir)
        self.run_addresses = (ctypes.cast(self.fn, ctypes.c_void_p).value, ctypes.addressof(self.argv),
                              ctypes.addressof(self.buffers), ctypes.addressof(self.sizes), buffers, self.num_inputs)

    def _runner(self, cache_dir: str):
        from .fast_launch import halide_runner
        return halide_runner(cache_dir)

    def _compile(self, source: str, cache_dir: str) -> tuple[str, str, str, float]:
        """(the shared runtime, the kernel's library, its exported name, seconds spent compiling it)."""
        runtime = runtime_library(cache_dir)
        return (runtime, *kernel_library(self.name, source, cache_dir, self.path))

    def _leading_arguments(self) -> list[int]:
        """Addresses of the arguments before the buffers (none on the CPU)."""
        return []

    def __call__(self, *args):
        if args[self.xnumel_arg] == 0:
            return
        if self.run is not None:
            self._run(args)
            return
        # One call at a time describes its tensors in the launcher's buffers: ctypes releases the GIL
        # for the call, and another thread launching this kernel would overwrite them (the C path
        # describes them in buffers of each call's own).
        with self._describing:
            buffers = self.num_inputs + self.num_outputs
            for k in range(buffers):
                self._describe(k, args[k])
            for k, value in enumerate(args[buffers:]):
                value = int(value)
                if not -INT32_MAX <= value <= INT32_MAX:
                    raise HalideLaunchError(f"smelt: kernel {self.name}: size {self.size_names[k]} = {value} does "
                                            f"not fit Halide's int32 index math")
                self.sizes[k] = value
            _errors.last = None
            if torch.autograd._profiler_enabled():  # a profile names the kernel (a ctypes call shows no op)
                with torch.profiler.record_function(self.name):
                    status = self.fn(self.argv)
            else:
                status = self.fn(self.argv)
        self._check(status)

    def _run(self, args) -> None:
        """The C path of a call: the same descriptions, sizes and checks as below, in one call."""
        _errors.last = None
        try:
            if torch.autograd._profiler_enabled():
                with torch.profiler.record_function(self.name):
                    status = self.run(*self.run_addresses, _PACKED_TYPE_CODE, args)
            else:
                status = self.run(*self.run_addresses, _PACKED_TYPE_CODE, args)
        except (TypeError, OverflowError) as e:
            for k, tensor in enumerate(args[:len(self.dtypes)]):
                if isinstance(tensor, torch.Tensor) and tensor.dtype != self.dtypes[k]:
                    raise self._wrong_dtype(k, tensor) from None
            raise HalideLaunchError(f"smelt: Halide kernel {self.name}: {e}") from None
        self._check(status)

    def _check(self, status: int) -> None:
        if status != 0:
            raise HalideLaunchError(f"smelt: Halide kernel {self.name} failed (status {status}): "
                                    f"{_errors.last or 'no message'}; source: {self.path}; from ATen ops: "
                                    f"{', '.join(self.origins)}")

    def _describe(self, k: int, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            raise HalideLaunchError(f"smelt: Halide kernel {self.name} got {type(tensor).__name__} "
                                    f"{getattr(tensor, 'device', '')} for buffer {k}: it runs on CPU tensors")
        if tensor.dtype != self.dtypes[k]:
            raise self._wrong_dtype(k, tensor)
        extent = storage_extent(self.name, tensor)
        buffer = self.buffers[k]
        empty = describes_empty(tensor, extent)
        buffer.host = ctypes.addressof(_EMPTY) if empty else tensor.data_ptr()
        self.dims[k].extent = described_extent(k, self.num_inputs, empty, extent)

    def _wrong_dtype(self, k: int, tensor: torch.Tensor) -> HalideLaunchError:
        return HalideLaunchError(f"smelt: Halide kernel {self.name} got a {tensor.dtype} tensor for buffer {k}, "
                                 f"which it reads as {self.dtypes[k]}; source: {self.path}; from ATen ops: "
                                 f"{', '.join(self.origins)}")

    def __repr__(self):
        return f"<Halide kernel {self.name} from {self.path}>"
