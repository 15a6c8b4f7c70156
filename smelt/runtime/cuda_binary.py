"""GPU kernels that smelt compiles with Triton and launches itself, through the CUDA driver API.

Triton's JIT pays three costs that smelt does not need on its first launch in a process: it
builds two C extensions with the host compiler (its driver utilities, and a launcher for each
argument signature: about 0.5 s together on the H100 host), and it binds arguments through
Python on every call. smelt instead describes each launch's arguments itself, compiles the kernel
with `triton.compile` for the device's target, loads the cubin with cuModuleLoadData and launches
it with cuLaunchKernel, from a small C extension built once per machine (fast_launch.py), else through
ctypes. The cubin and what launching it needs are kept on disk, so a later process loads it without
Triton at all.

Anything this path cannot do (another GPU vendor, a Triton whose compile API differs, a kernel
that needs scratch memory) makes the caller fall back to Triton's JIT, which is always correct.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import threading

import torch

# The compile itself and the kept files import no torch: compile workers (compile_worker.py) share them.
from .host_scalar import HostDouble
from .triton_cubin import CUDA_COMPILE_OPTIONS, CudaError, compile_cubin, read_kept, write_kept

log = logging.getLogger("smelt.runtime")

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_STATIC_SHARED_LIMIT = 48 * 1024  # past this, a kernel must opt in to more shared memory


class _Driver:
    """The few CUDA driver entry points a launch needs, from libcuda through ctypes."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        p, u, i, s = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
        self._error_name = lib.cuGetErrorName
        self._error_name.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]
        self.module_load_data = self._checked(lib.cuModuleLoadData, [ctypes.POINTER(p), p])
        self.module_get_function = self._checked(lib.cuModuleGetFunction, [ctypes.POINTER(p), p, ctypes.c_char_p])
        self.func_set_attribute = self._checked(lib.cuFuncSetAttribute, [p, i, i])
        self.ctx_get_current = self._checked(lib.cuCtxGetCurrent, [ctypes.POINTER(p)])
        self.ctx_get_device = self._checked(lib.cuCtxGetDevice, [ctypes.POINTER(i)])
        self.ctx_set_current = self._checked(lib.cuCtxSetCurrent, [p])
        self.device_get = self._checked(lib.cuDeviceGet, [ctypes.POINTER(i), i])
        self.primary_ctx_retain = self._checked(lib.cuDevicePrimaryCtxRetain, [ctypes.POINTER(p), i])
        self.launch_kernel = self._checked(lib.cuLaunchKernel, [p, u, u, u, u, u, u, u, p, p, p])
        self.launch_kernel_address = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value  # for fast_launch
        del s

    def error(self, what: str, status: int) -> CudaError:
        name = ctypes.c_char_p()
        self._error_name(status, ctypes.byref(name))
        return CudaError(f"{what} failed: {(name.value or b'?').decode()} ({status})")

    def _checked(self, fn, argtypes):
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int

        def call(*args):
            status = fn(*args)
            if status != 0:
                raise self.error(fn.__name__, status)
        call.__name__ = fn.__name__
        return call


_UNSET = object()
_fast_launch = _UNSET
_launcher_folder: str | None = None  # the cache folder the C launcher is built into


def keep_launcher_in(cache_dir: str | None) -> None:
    """Where the C launcher is built and kept (triton_loading passes the cache folder; the first wins)."""
    global _launcher_folder
    if _launcher_folder is None and cache_dir:
        _launcher_folder = cache_dir


def fast_launch():
    """The C launcher (fast_launch.py), built on the first launch of a process (into a private
    temporary folder where no cache folder was given); None: ctypes."""
    global _fast_launch
    if _fast_launch is _UNSET:
        import tempfile
        from .fast_launch import launcher
        folder = _launcher_folder or tempfile.mkdtemp(prefix="smelt_launcher_")
        _fast_launch = launcher(folder, driver().launch_kernel_address)
    return _fast_launch


@functools.lru_cache(maxsize=None)
def driver() -> _Driver:
    return _Driver()


# ------------------------------------------------------------------ describing a launch


def describe(args) -> tuple | None:
    """What a compiled variant depends on, per argument: a tensor's dtype and 16-byte alignment,
    an integer's width and divisibility by 16, or a float. None for arguments smelt never passes.
    Unlike Triton's JIT, an integer equal to 1 is not made a constant: a hand-written kernel passes
    its unit strides as constexprs (short_attention_kernel.py: as runtime values they cost its
    loads their vectorization, 3x its time on the H200)."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append(("ptr", str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool):
            return None
        elif isinstance(a, int):
            if not -2**63 <= a < 2**63:
                return None
            spec.append(("i32" if -2**31 <= a < 2**31 else "i64", a % 16 == 0))
        elif isinstance(a, HostDouble):
            spec.append(("fp64",))
        elif isinstance(a, float):
            spec.append(("fp32",))
        else:
            return None
    return tuple(spec)


# ------------------------------------------------------------------ the binary


@dataclasses.dataclass
class CudaBinary:
    """A compiled kernel and what launching it takes."""

    name: str
    cubin: bytes
    num_warps: int
    shared: int  # bytes of dynamic shared memory
    arg_kinds: tuple[str, ...]  # per runtime argument: "ptr", "i32", "i64", "fp32" or "fp64"
    extra_params: int  # parameters Triton appends (scratch pointers), passed as NULL

    def __post_init__(self):
        self._functions: dict[int, ctypes.c_void_p] = {}  # CUDA device -> loaded function
        self._lock = threading.Lock()
        # Argument storage that the parameter array points at: a launch only writes values in.
        ctype = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "fp32": ctypes.c_float,
                 "fp64": ctypes.c_double}
        self._slots = [ctype[k]() for k in self.arg_kinds] + [ctypes.c_uint64(0) for _ in range(self.extra_params)]
        self._params = (ctypes.c_void_p * len(self._slots))(*(ctypes.addressof(v) for v in self._slots))
        self._setters = [_pointer_value if k == "ptr" else None for k in self.arg_kinds]
        self._kinds = "".join(_KIND_LETTERS[k] for k in self.arg_kinds).encode()  # launch_ext.c's letters
        self._addresses: dict[int, int] = {}  # CUDA device -> the loaded function's address

    def _function(self, device: int) -> ctypes.c_void_p:
        function = self._functions.get(device)
        if function is None:
            cuda = driver()
            context = ctypes.c_void_p()
            cuda.ctx_get_current(ctypes.byref(context))
            if not context.value:
                # A thread on which no CUDA runtime call ran yet (autograd's device thread, when a
                # backward's first op is ours) has no current context: take torch's, the device's
                # primary one, as the runtime would.
                handle, primary = ctypes.c_int(), ctypes.c_void_p()
                cuda.device_get(ctypes.byref(handle), device)
                cuda.primary_ctx_retain(ctypes.byref(primary), handle)
                cuda.ctx_set_current(primary)
            current = ctypes.c_int()
            cuda.ctx_get_device(ctypes.byref(current))
            if current.value != device:  # the module must be loaded into the tensors' device's context
                raise CudaError(f"current CUDA context is for device {current.value}, tensors are on {device}")
            module, function = ctypes.c_void_p(), ctypes.c_void_p()
            cuda.module_load_data(ctypes.byref(module), self.cubin)
            cuda.module_get_function(ctypes.byref(function), module, self.name.encode())
            if self.shared > _STATIC_SHARED_LIMIT:
                cuda.func_set_attribute(function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)
            self._functions[device] = function
        return function

    def load(self, device: int) -> None:
        self._function(device)

    def launch(self, grid: tuple[int, ...], args, device: int, aligned: bool = False) -> bool:
        """Launches; with `aligned`, only where every pointer is 16-byte aligned (else returns
        False, launching nothing): the caller knows this binary was compiled for aligned ones."""
        gx, gy, gz = (*grid, 1, 1)[:3]
        stream = torch._C._cuda_getCurrentRawStream(device)
        fast = fast_launch()
        if fast is not None:
            address = self._addresses.get(device)
            if address is None:
                address = self._addresses[device] = self._function(device).value
            status = fast(address, gx, gy, gz, 32 * self.num_warps, self.shared, stream, self._kinds, tuple(args),
                          self.extra_params, aligned)
            if status == 0:
                return True
            if status == -1:
                return False
            raise driver().error("cuLaunchKernel", status)
        if aligned and any(a.data_ptr() & 15 for a in args if isinstance(a, torch.Tensor)):
            return False
        function = self._function(device)
        with self._lock:
            for slot, setter, arg in zip(self._slots, self._setters, args):
                slot.value = setter(arg) if setter is not None else arg
            driver().launch_kernel(function, gx, gy, gz, 32 * self.num_warps, 1, 1, self.shared, stream,
                                   self._params, None)
        return True

    # -------------------------------------------------------------- on disk

    def save(self, folder: str) -> None:
        write_kept(folder, {"name": self.name, "cubin": self.cubin, "num_warps": self.num_warps,
                            "shared": self.shared, "arg_kinds": self.arg_kinds, "extra_params": self.extra_params})

    @classmethod
    def read(cls, folder: str) -> CudaBinary | None:
        fields = read_kept(folder)
        return None if fields is None else cls(**fields)


_KIND_LETTERS = {"ptr": "p", "i32": "i", "i64": "l", "fp32": "f", "fp64": "d"}


def _pointer_value(tensor: torch.Tensor) -> int:
    return tensor.data_ptr()


def compile_binary(fn, spec: tuple, constexprs: dict, num_warps: int, capability: tuple[int, int],
                   options: dict = CUDA_COMPILE_OPTIONS, cache_dir: str | None = None) -> CudaBinary:
    """Compile `fn` (a JITFunction) for one argument description; raises triton.CompilationError
    for a kernel that does not compile and CudaError for one this path cannot launch."""
    return CudaBinary(**compile_cubin(fn, spec, constexprs, num_warps, capability, options, cache_dir))
