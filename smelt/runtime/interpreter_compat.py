"""Triton 3.6's interpreter turns a scalar kernel argument used as a loop bound (`range(0, rnumel,
RBLOCK)` with a dynamic row length) into an int with int() of a one-element array, which NumPy 2.4
rejects ("only 0-dimensional arrays can be converted to Python scalars"); Triton 3.9 takes the
element itself. smelt supports both, so under such a NumPy the interpreter's tensors get an
__index__ that takes the element (the same as 3.9's)."""
from __future__ import annotations

import numpy as np

_installed = False


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
