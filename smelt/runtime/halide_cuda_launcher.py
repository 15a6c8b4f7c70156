"""Launches a Halide pipeline compiled for CUDA (SMELT_CUDA_BACKEND=halide) on torch CUDA tensors.

Each tensor is described as on the CPU (halide_launcher.py: one dimension over its storage), but
by its device pointer: `device` is the tensor's address and `device_interface` Halide's CUDA
interface, `host` is null and no dirty flag is set, so Halide neither allocates nor copies. The
pipeline's first argument, its user context, points at a `smelt_cuda_launch` struct that the
runtime's shim (halide_cuda_shim.c) reads: torch's context for the device and its current stream,
so Halide's kernels queue behind and before torch's own work, as a Triton kernel's do.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from .halide_compile import launch_header
from .halide_cuda_compile import kernel_library, runtime_library
from .halide_launcher import HALIDE_TYPE_CODE, HalideLauncher, HalideLaunchError, described_extent, describes_empty, storage_extent

# bfloat16 travels as its 16 bits (halide_gpu_schedule.py): Halide checks the buffer's type.
_TYPE_CODE = {**HALIDE_TYPE_CODE, torch.bfloat16: (1, 16)}


class CudaLaunch(ctypes.Structure):
    """struct smelt_cuda_launch in halide_cuda_shim.c."""
    _fields_ = [("context", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("device", ctypes.c_int)]


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuDeviceGet", "cuDevicePrimaryCtxRetain"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=None)
def primary_context(device: int) -> int:
    """torch's context on `device`: the runtime API (and so torch) works in the primary context."""
    torch.cuda.init()
    lib = _driver()
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    for call, args in (("cuDeviceGet", (ctypes.byref(handle), device)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), handle))):
        status = getattr(lib, call)(*args)
        if status != 0:
            raise HalideLaunchError(f"smelt: {call} for CUDA device {device} failed with CUDA error {status}")
    return context.value


@functools.lru_cache(maxsize=None)
def _runtime(path: str):
    """The runtime library, set up once: Halide keeps the allocations of the pipelines' own
    intermediate Funcs for reuse, since cuMemFree would synchronize the device at every launch."""
    lib = ctypes.CDLL(path)
    lib.halide_cuda_device_interface.restype = ctypes.c_void_p
    lib.halide_reuse_device_allocations.argtypes = [ctypes.c_void_p, ctypes.c_bool]
    lib.halide_reuse_device_allocations(None, True)
    return lib


_PLACEHOLDERS: dict[int, torch.Tensor] = {}


def _placeholder(device: int) -> int:
    """A real device address for an empty tensor: a null one would make the call a bounds query."""
    return _PLACEHOLDERS.setdefault(device, torch.empty(16, dtype=torch.uint8, device=device)).data_ptr()


class HalideCudaLauncher(HalideLauncher):
    """Calls one Halide CUDA kernel as `name(*input_buffers, *output_buffers, *sizes)`."""

    closes_library = False  # (see HalideLauncher.closes_library)

    def __init__(self, name: str, source: str, origins: list[str], cache_dir: str, path: str | None = None,
                 header=None):
        self.launch = CudaLaunch()
        self.launch_address = ctypes.c_void_p(ctypes.addressof(self.launch))
        super().__init__(name, source, origins, cache_dir, path, header)
        self.interface = _runtime(self.runtime_path).halide_cuda_device_interface()
        self.device = None

    def _compile(self, source: str, cache_dir: str) -> tuple[str, str, str, float]:
        capability = torch.cuda.get_device_capability(torch.cuda.current_device())
        self.runtime_path = runtime_library(cache_dir)
        return (self.runtime_path, *kernel_library(self.name, source, cache_dir, capability, self.path))

    def _leading_arguments(self) -> list[int]:
        return [ctypes.addressof(self.launch_address)]

    def _runner(self, cache_dir: str):
        return None  # launch_ext.c's halide_run describes CPU tensors: CUDA ones go through _describe

    def __call__(self, *args):
        device = args[0].device.index if isinstance(args[0], torch.Tensor) and args[0].is_cuda else None
        if device is None:
            raise HalideLaunchError(f"smelt: Halide CUDA kernel {self.name} got {type(args[0]).__name__} "
                                    f"{getattr(args[0], 'device', '')} for buffer 0: it runs on CUDA tensors")
        with self._describing:  # the launch's stream and device are the launcher's too: one call at a time
            if device != self.device:
                self.launch.context, self.launch.device, self.device = primary_context(device), device, device
            self.launch.stream = torch.cuda.current_stream(device).cuda_stream
            super().__call__(*args)

    def _describe(self, k: int, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.index != self.device or not tensor.is_cuda:
            raise HalideLaunchError(f"smelt: Halide CUDA kernel {self.name} got {type(tensor).__name__} "
                                    f"{getattr(tensor, 'device', '')} for buffer {k}: it runs on tensors of "
                                    f"cuda:{self.device}, the device of its first buffer")
        extent = storage_extent(self.name, tensor)
        buffer = self.buffers[k]
        buffer.type.code, buffer.type.bits = _TYPE_CODE[tensor.dtype]
        buffer.host = None
        empty = describes_empty(tensor, extent)
        buffer.device = _placeholder(self.device) if empty else tensor.data_ptr()
        buffer.device_interface = self.interface
        buffer.flags = 0  # Halide marks outputs device-dirty: cleared, or a later call would copy to a null host
        self.dims[k].extent = described_extent(k, self.num_inputs, empty, extent)

    def __repr__(self):
        return f"<Halide CUDA kernel {self.name} from {self.path}>"


def halide_launcher(name: str, source: str, origins: list[str], cache_dir: str, path: str | None = None):
    """The launcher for a generated Halide module: its DEVICE says which target its schedule is for."""
    header = launch_header(name, source)
    launcher = HalideCudaLauncher if header.DEVICE == "cuda" else HalideLauncher
    return launcher(name, source, origins, cache_dir, path, header)
