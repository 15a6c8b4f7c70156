"""Repairs to Triton's interpreter, installed before the first interpreted kernel runs.

- Triton 3.6's interpreter turns a scalar kernel argument used as a loop bound (`range(0, rnumel,
  RBLOCK)` with a dynamic row length) into an int with int() of a one-element array, which NumPy
  2.4 rejects ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.9 takes
  the element itself. smelt supports both, so under such a NumPy the interpreter's tensors get an
  __index__ that takes the element (the same as 3.9's).
- A kernel's call of another @jit function (Philox's tl.rand, a finisher, a combo body) patches
  triton.language with the interpreter's builtins and never puts them back (3.6 to 3.9): every
  later GPU compile in the process then fails inside Triton ("'value' object has no attribute
  'dtype'"), as SMELT_CHECK_CUDA_COMPILE's compiles did after any dropout. Each such call now
  restores what it patched when it returns.
- The interpreter keeps a launch's state in the process: triton.language patched for the launch
  and put back after it, and the program id in one global builder. Two threads launching at once
  (a compiled graph called from threads) read each other's program ids, and their patches
  interleaved so that one thread "restored" the other's patches for good (every later GPU compile
  failed, "'value' object has no attribute 'data'"). Launches now take `LOCK`, one at a time, as
  does SMELT_CHECK_CUDA_COMPILE's compile, which must not run while triton.language is patched.
- Its bfloat16 <-> float32 casts go through a generic float converter that clamps the exponent of
  a subnormal to 0 (3.6 to 3.9): a bfloat16 subnormal loaded as float32 came out 0 (sqrt(9.2e-41)
  was 0, eager's 9.6e-21), where the GPU's conversion is exact. The two formats share their
  exponent, so the casts are now the bit shifts they are (float32 to bfloat16 rounding to nearest
  even, as the GPU's cvt.rn.bf16.f32).
"""
from __future__ import annotations

import threading

import numpy as np

_installed = False
_nested = threading.local()  # .scopes: the patch scopes opened by the device function calls under way
LOCK = threading.RLock()  # held by each interpreted launch (and GPU compile) while it runs


def _numpy_refuses_one_element_int() -> bool:
    try:
        int(np.ones(1, dtype=np.int64))
    except TypeError:
        return True
    return False


def install() -> None:
    """Once per process, before an interpreted kernel runs."""
    global _installed
    if _installed:
        return
    _installed = True
    _restore_after_device_calls()
    _one_launch_at_a_time()
    _exact_bfloat16_casts()
    from . import interpreter_combines
    interpreter_combines.install()
    if not _numpy_refuses_one_element_int():
        return
    from triton.runtime import interpreter
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # another interpreter layout: leave it as it is
        return

    def patch_lang_tensor(tensor, scope, *rest):
        original(tensor, scope, *rest)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_lang_tensor


def _restore_after_device_calls() -> None:
    from triton.runtime import interpreter
    patch_lang = getattr(interpreter, "_patch_lang", None)
    function = getattr(interpreter, "InterpretedFunction", None)
    if patch_lang is None or function is None:  # another interpreter layout: leave it as it is
        return
    device_call = function.__call__

    def recording_patch_lang(fn):
        scope = patch_lang(fn)
        opened = getattr(_nested, "scopes", None)
        if opened is not None and hasattr(scope, "restore"):
            opened.append(scope)
        return scope

    def restoring_call(self, *args, **kwargs):
        outer = getattr(_nested, "scopes", None)
        _nested.scopes = []
        try:
            return device_call(self, *args, **kwargs)
        finally:
            for scope in reversed(_nested.scopes):
                scope.restore()  # back to the caller's patches (the kernel's launch undoes those)
            _nested.scopes = outer

    interpreter._patch_lang = recording_patch_lang
    function.__call__ = restoring_call


def _one_launch_at_a_time() -> None:
    from triton.runtime import interpreter
    executor = getattr(interpreter, "GridExecutor", None)
    if executor is None:  # another interpreter layout: leave it as it is
        return
    launch = executor.__call__

    def serialized_launch(self, *args, **kwargs):
        with LOCK:
            return launch(self, *args, **kwargs)
    executor.__call__ = serialized_launch


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even; NaN stays a (quiet) NaN of its sign."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((bits >> 16) | 0x0040).astype(np.uint16), rounded)


def _exact_bfloat16_casts() -> None:
    import triton.language as tl
    from triton.runtime import interpreter
    builder, handle = getattr(interpreter, "InterpreterBuilder", None), getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None or not hasattr(builder, "cast_impl"):  # another interpreter layout
        return
    cast = builder.cast_impl

    def exact_cast(self, src, dst_type):
        source, target = src.dtype.scalar, dst_type.scalar
        if source == tl.bfloat16 and target == tl.float32:
            return handle(bfloat16_bits_to_float32(src.data), target)
        if source == tl.float32 and target == tl.bfloat16:
            return handle(float32_to_bfloat16_bits(src.data), target)
        return cast(self, src, dst_type)
    builder.cast_impl = exact_cast
