"""The scalar op vocabulary that loop bodies are written in, and the handler that interprets it.

A Pointwise or Reduction node holds `inner_fn(index) -> value`, written against `ops`. Calling it
while a handler is installed gives whatever that handler makes: Triton code (codegen), the list of
buffers read (dependency analysis), or readable text (IR dumps). This is smelt's one piece of
context-scoped state; everything else is passed explicitly.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable

# The ops every handler understands. Unary and binary math take and return handler values;
# `load` takes a buffer name and a sympy index; `constant` a Python scalar and a torch dtype;
# `index_expr` a sympy expression of the loop's index vars; `masked` a mask value, a zero-argument
# body function, and the value where the mask is false (loads inside the body are masked too).
UNARY_OPS = (
    "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh "
    "tanh asinh acosh atanh erf erfc erfinv sigmoid reciprocal floor ceil trunc round sign signbit "
    "isnan isinf logical_not bitwise_not relu lgamma i0"
).split()
BINARY_OPS = (
    "add sub mul truediv floordiv remainder fmod pow maximum minimum atan2 copysign hypot nextafter "
    "eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
    "left_shift right_shift"
).split()
OTHER_OPS = "load constant index_expr to_dtype where masked indirect_indexing rand randn randint64".split()
# `indirect_indexing(value, size)` turns a loaded integer (negative counts from the end, as in
# eager) into a sympy symbol that index expressions may use: gather, index, embedding.
INDIRECT_PREFIX = "indirect"
# `rand(seed, offset)` / `randn(seed, offset)` give a float32 drawn from U[0, 1) / N(0, 1), and
# `randint64(seed, offset, low, high)` an int64 in [low, high): counter-based Philox values, a pure
# function of (seed, offset), so recomputing one anywhere gives the same number.
# Float32 division and square root for a value eager rounds to bfloat16 or float16 before anyone
# reads it (lowering/half_rounding.py): a handler may spell them with the GPU's approximate
# instructions (a few float32 ulps, far under a half float's rounding); one that does not say so
# (`approximates = True`) is handed the exact op.
APPROXIMATE_OPS = {"approx_truediv": "truediv", "approx_sqrt": "sqrt"}
ALL_OPS = frozenset(UNARY_OPS + BINARY_OPS + OTHER_OPS) | frozenset(APPROXIMATE_OPS)

_handler: contextvars.ContextVar[Any] = contextvars.ContextVar("smelt_ops_handler", default=None)


class _OpsProxy:
    """`ops.add(a, b)` calls `add` on the handler installed by `use_handler`."""

    def __getattr__(self, name: str) -> Callable:
        if name not in ALL_OPS:
            raise AttributeError(f"smelt: '{name}' is not in the ops vocabulary")

        # Resolved at call time, so `ops.exp` can be stored before any handler is installed.
        def call(*args, **kwargs):
            handler = _handler.get()
            if handler is None:
                raise RuntimeError(f"smelt: ops.{name} called outside of a handler (no loop body is being traced)")
            # The class says so: a handler's __getattr__ may answer any name (Halide's makes an op of it).
            spelled = name if name not in APPROXIMATE_OPS or getattr(type(handler), "approximates", False) is True \
                else APPROXIMATE_OPS[name]
            return getattr(handler, spelled)(*args, **kwargs)
        call.__name__ = name
        return call


ops = _OpsProxy()


@contextlib.contextmanager
def use_handler(handler):
    token = _handler.set(handler)
    try:
        yield handler
    finally:
        _handler.reset(token)


class TextHandler:
    """Renders a loop body as readable text, for IR dumps and error messages.

    A long subexpression gets a name (t0, t1, ...) and a line of its own in `lines`, so a body
    that uses a value many times (a chain of wheres) renders in linear, not exponential, size.
    """

    NAME_ABOVE = 60  # characters

    def __init__(self):
        self.lines: list[str] = []
        self._names: dict[str, str] = {}  # a long subexpression's text -> its name, given once

    def _named(self, text: str) -> str:
        if len(text) <= self.NAME_ABOVE:
            return text
        if text not in self._names:
            self._names[text] = f"t{len(self.lines)}"
            self.lines.append(f"{self._names[text]} = {text}")
        return self._names[text]

    def render(self, value) -> str:
        return "; ".join(self.lines + [str(value)])

    def __getattr__(self, name: str):
        if name in UNARY_OPS or name in BINARY_OPS:
            return lambda *args: self._named(f"{name}({', '.join(map(str, args))})")
        raise AttributeError(name)

    def load(self, name, index):
        return self._named(f"{name}[{index}]")

    def constant(self, value, dtype):
        return repr(value)

    def index_expr(self, expr, dtype):
        return self._named(f"index({expr})")

    def to_dtype(self, x, dtype):
        return self._named(f"{x}.to({str(dtype).replace('torch.', '')})")

    def where(self, cond, a, b):
        return self._named(f"where({cond}, {a}, {b})")

    def masked(self, mask, body, other):
        return self._named(f"masked({mask}, {body()}, {other!r})")

    def rand(self, seed, offset):
        return f"rand({seed}, {offset})"

    def randn(self, seed, offset):
        return f"randn({seed}, {offset})"

    def randint64(self, seed, offset, low, high):
        return f"randint64({seed}, {offset}, {low}, {high})"

    def indirect_indexing(self, value, size):
        count = getattr(self, "_indirect_count", 0)
        self._indirect_count = count + 1
        return indirect_symbol(count)


def indirect_symbol(k: int):
    import sympy
    return sympy.Symbol(f"{INDIRECT_PREFIX}{k}", integer=True)


def is_indirect(symbol) -> bool:
    return str(symbol).startswith(INDIRECT_PREFIX)


class OpCounter(TextHandler):
    """Counts the ops and loads a loop body runs: `ops` counts a value the body reuses each time
    it is used (an inlined value read twice), `distinct_ops` once, as a kernel computes it (the code
    generators name each value once)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self._seen: set[str] = set()
        self._loads: dict[tuple, str] = {}

    @property
    def distinct_ops(self) -> int:
        return len(self._seen)

    def _count(self, value: str) -> str:
        self.ops += 1
        self._seen.add(value)  # a value's text, or the one name a long text gets: equal for equal values
        return value

    def __getattr__(self, name: str):
        op = super().__getattr__(name)

        def counted(*args):
            return self._count(op(*args))
        return counted

    def load(self, name, index):
        # A token per (buffer, index), equal for equal loads, rather than the index printed: sympy's
        # printer took 0.2 s of BERT's real-size lowering, counting for the recompute rules.
        token = self._loads.setdefault((name, index), f"{name}[#{len(self._loads)}]")
        return self._count(token)

    def index_expr(self, expr, dtype):
        return self._count(self._loads.setdefault(("index", expr), f"index(#{len(self._loads)})"))


class ReadsHandler(OpCounter):
    """Records every (buffer name, index) a loop body loads (and counts its ops)."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, Any]] = []

    def load(self, name, index):
        self.reads.append((name, index))
        return super().load(name, index)
