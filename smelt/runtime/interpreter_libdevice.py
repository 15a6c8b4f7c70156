"""Stand-ins for libdevice under the Triton interpreter, which cannot call libdevice.

CPU graphs run Triton kernels through the interpreter; their kernels import this module in place
of `triton.language.extra.libdevice`. Under the interpreter a block is a numpy array, so each
stand-in applies the matching torch function to it: one table instead of a hand-written
approximation per function, and accurate enough that a CPU test failure points at codegen rather
than at the stand-in. The GPU runs the real libdevice.
"""
import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _array(value, like: np.ndarray) -> np.ndarray:
    if isinstance(value, tl.tensor):
        return value.handle.data
    return np.asarray(value, dtype=like.dtype)  # a literal printed into the kernel


def _result_type(args, shape, scalar):
    # An operand of the result's shape gives its type: a scalar block's array has shape (1,).
    for a in args:
        if isinstance(a, tl.tensor) and a.handle.data.shape == shape:
            return a.type.with_element_ty(scalar) if a.type.is_block() else scalar
    return tl.block_type(scalar, list(shape))


def _standin(name: str, torch_fn, predicate: bool = False):
    def apply(*args):
        first = next(a for a in args if isinstance(a, tl.tensor))
        like = first.handle.data
        result = torch_fn(*(torch.from_numpy(np.ascontiguousarray(_array(a, like))) for a in args)).numpy()
        scalar = tl.int1 if predicate else first.dtype.scalar
        if predicate:
            result = result.astype(np.bool_)
        else:
            result = result.astype(like.dtype, copy=False)
        return tl.tensor(TensorHandle(result, scalar), _result_type(args, result.shape, scalar))
    apply.__name__ = apply.__qualname__ = name
    return apply


_UNARY = {
    "tanh": torch.tanh, "expm1": torch.expm1, "log1p": torch.log1p, "log10": torch.log10,
    "sinh": torch.sinh, "cosh": torch.cosh, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma, "trunc": torch.trunc,
    "nearbyint": torch.round,  # round half to even, like rint
    "j0": torch.special.bessel_j0, "j1": torch.special.bessel_j1, "y0": torch.special.bessel_y0,
    "y1": torch.special.bessel_y1, "cyl_bessel_i0": torch.special.i0, "cyl_bessel_i1": torch.special.i1,
    "log2": torch.log2, "exp2": torch.exp2, "cbrt": lambda x: x.sign() * x.abs() ** (1 / 3),
    "exp": torch.exp, "log": torch.log, "sin": torch.sin, "cos": torch.cos, "rsqrt": torch.rsqrt,
    "sqrt": torch.sqrt,
}
_BINARY = {
    "pow": torch.pow, "atan2": torch.atan2, "fmod": torch.fmod, "copysign": torch.copysign,
    "hypot": torch.hypot, "nextafter": torch.nextafter,
}
_PREDICATES = {"signbit": torch.signbit}

for _name, _fn in {**_UNARY, **_BINARY}.items():
    globals()[_name] = _standin(_name, _fn)
for _name, _fn in _PREDICATES.items():
    globals()[_name] = _standin(_name, _fn, predicate=True)


def round_to_bfloat16(x):
    """float -> bfloat16 rounded to nearest even, as the GPU converts; the interpreter's own
    conversion truncates. Not a libdevice function: smelt's kernels call it only when interpreted."""
    data = torch.from_numpy(np.ascontiguousarray(x.handle.data)).to(torch.bfloat16).view(torch.uint16).numpy()
    return tl.tensor(TensorHandle(data, tl.bfloat16), _result_type([x], data.shape, tl.bfloat16))


def check_index(in_bounds, message: str):
    """Raises IndexError where an indirect index is out of bounds. Triton's interpreter compiles
    tl.device_assert out (its options never turn debug on), so interpreted kernels call this
    instead. Not a libdevice function."""
    data = in_bounds.handle.data if isinstance(in_bounds, tl.tensor) else np.asarray(in_bounds)
    if not np.all(data):
        raise IndexError(message)
