"""Triton's Philox random functions (tl.rand, tl.rand4x, tl.randn, tl.randint4x), runnable under the interpreter.

Interpreted CPU kernels cannot call Triton's @jit library functions (they were not made in
interpreter mode). These are the same functions, from the same source, rebuilt as interpreted
functions whose globals point at one another: CPU kernels draw exactly the values a GPU kernel
with the same seed and offsets draws.
"""
import types

import triton.language.random as _triton_random
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_scope = dict(vars(_triton_random))
for _name, _value in list(_scope.items()):
    if isinstance(_value, JITFunction):
        _fn = _value.fn
        _copy = types.FunctionType(_fn.__code__, _scope, _fn.__name__, _fn.__defaults__, _fn.__closure__)
        _scope[_name] = InterpretedFunction(_copy)

rand = _scope["rand"]
randn = _scope["randn"]
randint4x = _scope["randint4x"]
rand4x = _scope["rand4x"]
