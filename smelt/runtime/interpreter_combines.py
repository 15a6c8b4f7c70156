"""Triton's interpreter runs a reduction or scan with a combine function of its own (argmax with its
index, Welford, logcumsumexp, smelt's tuple combines) one element at a time, calling the function on
one-element arrays: test_split_reduction's test_keepdim (an argmax beside a variance) took 20.7 s
under the interpreter, 2.3 s with this. Here the same combine function
runs over whole arrays in a tree, log2(n) calls per reduction:

- a reduction combines neighbours (0 with 1, 2 with 3, ...), the lower index always on the left, then
  again over the results, so the order of the operands is kept and only associativity is assumed, as
  the GPU's own reduction trees assume it;
- a scan is Hillis and Steele's: at step k each element is combined with the running value k places
  before it (on the left), over whole rolled rows since the interpreter's blocks are powers of two.

Each step's results are stored in the input's NumPy types, as the interpreter's element loop stores
them. A combine function that cannot run over arrays (it raises) runs through the interpreter's own
loop instead. Installed by interpreter_compat.install, for Triton versions whose interpreter has the
ReduceOps.generic_reduce and ScanOps.generic_scan this replaces (3.6 to 3.9).
"""
from __future__ import annotations

import numpy as np


def install() -> None:
    from triton.runtime import interpreter
    reduce_ops, scan_ops = getattr(interpreter, "ReduceOps", None), getattr(interpreter, "ScanOps", None)
    if reduce_ops is not None and hasattr(reduce_ops, "generic_reduce") and hasattr(reduce_ops, "unravel"):
        reduce_ops.generic_reduce = _falling_back(_tree_reduce, reduce_ops.generic_reduce)
    if scan_ops is not None and hasattr(scan_ops, "generic_scan"):
        scan_ops.generic_scan = _falling_back(_tree_scan, scan_ops.generic_scan)


def _falling_back(fast, original):
    def run(self, input):
        try:
            return fast(self, input)
        except Exception:  # a combine written for one element only: the interpreter's loop runs it
            return original(self, input)
    return run


def _combine(op, dtypes, left: list, right: list) -> list:
    """op's combine function over arrays: (left..., right...) -> arrays of left's NumPy types."""
    import triton.language as tl
    args = [op.to_tensor(a, dtype) for a, dtype in zip(left + right, dtypes + dtypes)]
    out = op.combine_fn.fn(*args)
    out = out if isinstance(out, tuple) else (out,)
    if len(out) != len(left):
        raise ValueError("the combine returned another number of values")
    values = [o.handle.data if isinstance(o, tl.core.tensor) else o for o in out]
    return [np.broadcast_to(np.asarray(v), a.shape).astype(a.dtype) for v, a in zip(values, left)]


def _tree_reduce(op, input):
    original_axis = op.axis
    input, axis = op.unravel(input, op.axis)
    dtypes = [t.dtype for t in input]
    data = [t.handle.data for t in input]
    shape = data[0].shape
    while data[0].shape[axis] > 1:
        n = data[0].shape[axis]
        if n % 2:  # Triton's blocks are powers of two; anything else takes the element loop
            raise ValueError(f"a reduction over {n} elements")
        left = [np.take(d, np.arange(0, n, 2), axis=axis) for d in data]
        right = [np.take(d, np.arange(1, n, 2), axis=axis) for d in data]
        data = _combine(op, dtypes, left, right)
    results = []
    for t, d in zip(input, data):
        d = np.take(d, 0, axis=axis)
        if op.keep_dims:
            if original_axis is not None:
                d = np.expand_dims(d, axis)
            else:
                for _ in range(len(shape)):
                    d = np.expand_dims(d, 0)
        elif original_axis is None:
            d = d.item()
        results.append(op.to_tensor(d, t.dtype))
    return results


def _tree_scan(op, input):
    axis = op.axis
    dtypes = [t.dtype for t in input]
    data = [t.handle.data for t in input]
    n = data[0].shape[axis]
    place = np.arange(n).reshape([-1 if k == axis else 1 for k in range(data[0].ndim)])
    step = 1
    while step < n:
        # Whole rows (Triton's blocks are powers of two), the running values rolled `step` places on;
        # the first `step` places keep what they hold.
        earlier = [np.roll(d, step, axis=axis) for d in data]
        with np.errstate(all="ignore"):  # the discarded places combine wrapped-around values
            merged = _combine(op, dtypes, earlier, data)
        data = [np.where(place >= step, m, d) for m, d in zip(merged, data)]
        step *= 2
    return [op.to_tensor(d, t.dtype) for t, d in zip(input, data)]
