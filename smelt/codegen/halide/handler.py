"""The ops vocabulary printed as Halide expressions: the handler a pipeline's values are computed
through (codegen/halide/kernel.py), also used by its reduction and scan helpers."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import sympy
import torch

from ...ir.ops import indirect_symbol
from ..common import CSEVar, computed, register_dtype
from . import random
from .ops import (BOOL_ARITHMETIC, BOOL_UNARY, FLOAT64_UNPRINTED, FLOAT_BINARY, FLOAT_UNARY, INFIX, INT_BINARY, INT_UNARY,
                  PREDICATE_OPS, WRAPPING_INT, UnsupportedInHalide, halide_type, literal, shift_text, signbit_bits,
                  wrapping_int_text, wrapping_int_unary_text)

if TYPE_CHECKING:
    from .kernel import HalideKernel


# The pure vars a value of each rank is a function of, as a helper that defines a Func over them
# is passed them.
PURE_VARS = {0: "()", 1: "(x,)", 2: "(r, x)"}


_NARROW_INTS = {torch.uint8: 0xFF, torch.int8: 0xFF, torch.int16: 0xFFFF}  # the bits each keeps


def _is_int(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and dtype != torch.bool


@dataclasses.dataclass(frozen=True)
class ConstantVar(CSEVar):
    """A literal whose value the printer still knows (a division by a constant zero needs it)."""

    value: object = None


@dataclasses.dataclass(frozen=True)
class IndexVar(CSEVar):
    """An integer value of an index expression, which the printer still knows: a comparison of two
    such values is a cut of the kernel's domain, and inside a piece of it may be decided (pieces.py)."""

    index: sympy.Expr = None


COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})

# Float ops whose NaN result is an operand's NaN made quiet or the default NaN: over operands a
# bfloat16 holds exactly (HalideKernel.rounds_unguarded) the result rounds to bfloat16 without a NaN
# guard (kernel.CONVERSION_HELPERS). IEEE arithmetic and helpers that end in it; not abs, neg,
# maximum or where, which pass a NaN's bits on as they are (a signaling one too), nor erf, log or tanh,
# whose helpers return a NaN as it came, nor an op Halide folds to its operand (x * 1).
# test_halide_math_edges runs each on NaNs of every kind.
QUIETING_BINARY = frozenset({"add", "sub", "mul", "truediv"})
QUIETING_UNARY = frozenset({"exp", "sigmoid", "sqrt", "rsqrt", "reciprocal"})


def _folds_to_an_operand(name: str, a, b) -> bool:
    """Whether Halide's simplifier may fold `a name b` to an operand or its negation (x * 1, 0 - x)."""
    def known(v, values):
        return isinstance(v, ConstantVar) and v.value in values
    if name in ("add", "sub"):
        return known(a, (0,)) or known(b, (0,))
    if name == "mul":
        return known(a, (1, -1)) or known(b, (1, -1))
    return known(b, (1, -1))  # truediv


# Ops whose Halide form is the C library's, called per element, printed on float32 as special.py's
# vectorized helper instead.
FLOAT32_HELPERS = frozenset({"sin", "cos", "sinh", "cosh"})


def _known_index(v: CSEVar) -> sympy.Expr | None:
    if isinstance(v, IndexVar):
        return v.index
    if isinstance(v, ConstantVar) and type(v.value) is int:
        return sympy.Integer(v.value)
    return None


class HalideOps:
    """The ops vocabulary printed as Halide expressions inside one pipeline."""

    def __init__(self, kernel: HalideKernel):
        self.k = kernel

    @staticmethod
    def _operand(v: CSEVar) -> str:
        text = v.name
        return f"({text})" if text.startswith("-") or " " in text else text

    def load(self, name, index):
        return self.k.load(name, self.k.simplify(index))

    def constant(self, value, dtype):
        return ConstantVar(literal(value, dtype), dtype, 0, value)

    def index_expr(self, expr, dtype):
        expr = self.k.simplify(expr)
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        text = f"hl.cast({halide_type(register_dtype(dtype))}, {self.k.index_text(expr, wide=dtype == torch.int64)})"
        var = self.k.emit(text, dtype, self.k.rank_of(expr))
        return IndexVar(var.name, var.dtype, var.rank, expr)

    def _known_bool(self, value: bool) -> ConstantVar:
        return self.constant(value, torch.bool)

    def to_dtype(self, x: CSEVar, dtype: torch.dtype) -> CSEVar:
        if x.dtype == dtype:
            return x
        if isinstance(x, ConstantVar):  # converted as eager converts, so it stays a known value
            return self.constant(torch.tensor(x.value, dtype=x.dtype).to(dtype).item(), dtype)
        if dtype == torch.bool:
            return self.k.emit(f"{self._operand(x)} != {literal(0, x.dtype)}", dtype, x.rank)
        src, dst = register_dtype(x.dtype), register_dtype(dtype)
        text = x.name
        if dst != dtype:  # a half float: round through its own type
            if x.dtype == torch.float16 and dtype == torch.bfloat16:
                # A float16 NaN's payload lies in bits bfloat16 drops: Halide's conversion then gives
                # inf (eager gives NaN); the NaN is made the default one first (through to_bfloat16
                # alone the 16 signaling ones came out 0.0, not NaN: why is not known).
                text = f"hl.select(hl.is_nan({text}), {literal(float('nan'), torch.float32)}, {text})"
            text = self.k.widen(self.k.narrow(text, dtype, self.k.rounds_unguarded(x)), dtype)
        elif dst in _NARROW_INTS and src.itemsize >= 4:
            # Eager converts a float to a narrow integer through a wide one, then wraps
            # (-1.5 -> uint8 255). Halide's simplifier folds cast(u8, cast(i32, f)) into a direct
            # cast, even across ops (f.to(int32).to(uint8)), which LLVM makes fptoui: undefined
            # off range, 0 in vector code. The mask keeps the wide step.
            wide = f"hl.cast(hl.Int(32), {text})" if src.is_floating_point else text
            text = f"hl.cast({halide_type(dst)}, {wide} & {_NARROW_INTS[dst]})"
        elif _is_int(src) and _is_int(dst) and src.itemsize == dst.itemsize:
            # Signedness alone (a wrapping multiply's int64 -> uint64). Halide's simplifier folds a
            # cast, and even a reinterpret, of a float's conversion into one conversion (fptoui: -2.77
            # -> int64 -> uint64 gave 2**64 - 1, and x.to(int64).pow(2) 1 for -2; CPU fuzz seed 1500):
            # the sign bit is moved on its own, the other bits under a mask it keeps.
            top = 1 << (src.itemsize * 8 - 1)
            sign = f"({text} < 0)" if src.is_signed else f"({text} >= {literal(top, src)})"
            high = literal(-top if dst.is_signed else top, dst)
            text = (f"(hl.cast({halide_type(dst)}, {text} & {literal(top - 1, src)}) | "
                    f"hl.select({sign}, {high}, {literal(0, dst)}))")
        elif _is_int(src) and _is_int(dst) and dst.itemsize < src.itemsize:
            # 64 -> 32 bits wraps as eager does; the mask keeps the wide step, as for the narrow ints.
            # Into a signed type the low half is also sign-extended by an xor and a subtraction:
            # Halide's bounds of a masked value ([0, 2**32)) do not fit int32, and its trimming of
            # no-op reduction steps then dropped an argmax's index search in a task's tail (CPU fuzz
            # seed 4368). A shift pair would sign-extend too, but Halide folds it, and with it the step.
            if dst.is_signed:
                wide = text if src.is_signed else f"hl.reinterpret(hl.Int(64), {text})"
                half = literal(0x80000000, torch.int64)
                text = (f"hl.cast({halide_type(dst)}, (({wide} & {literal(0xFFFFFFFF, torch.int64)}) ^ {half})"
                        f" - {half})")
            else:
                text = f"hl.cast({halide_type(dst)}, {text} & {literal(0xFFFFFFFF, src)})"
        elif src in (torch.int64, torch.uint64) and dst == torch.float64:
            # As two exact halves and one rounding: Halide 21's strict-float vector conversion on
            # AVX-512 DQ read a wrong lane (an int64 sum of 18 elements; CPU fuzz seed 1950).
            half = "hl.Int(32)" if src == torch.int64 else "hl.UInt(32)"
            high = f"hl.cast(hl.Float(64), hl.cast({half}, {self._operand(x)} >> 32))"
            low = f"hl.cast(hl.Float(64), hl.cast(hl.UInt(32), {self._operand(x)} & {literal(0xFFFFFFFF, src)}))"
            text = f"{high} * hl.f64(4294967296.0) + {low}"
        elif src != dst:
            text = f"hl.cast({halide_type(dst)}, {text})"
        else:
            if self.k.rounds_unguarded(x):  # retyped (bfloat16 to float32): still exact in bfloat16
                self.k.quiet_values.add(x.name)
            return CSEVar(x.name, dtype, x.rank)
        var = self.k.emit(text, dtype, x.rank)
        if not src.is_floating_point:  # an integer's value is no NaN
            self.k.quiet_values.add(var.name)
        return var

    def where(self, cond, a, b):
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = self.to_dtype(a, dtype), self.to_dtype(b, dtype)
        if isinstance(cond, ConstantVar) and cond.dtype == torch.bool:  # known: a literal, or decided in a piece
            return a if cond.value else b
        return self.k.emit(f"hl.select({cond}, {a}, {b})", dtype, max(cond.rank, a.rank, b.rank))

    def masked(self, mask, body, other):
        if isinstance(mask, ConstantVar) and mask.dtype == torch.bool:  # known: a literal, or decided in a piece
            if mask.value:
                return body()
            # Never read here: the body only gives the fill's dtype (its dead lines define nothing).
            gathers = self.k.schedule.gathers
            self.k.mask_stack.append(mask.name)
            try:
                dtype = body().dtype
            finally:
                self.k.mask_stack.pop()
                self.k.schedule.gathers = gathers
            return self.constant(other, dtype)
        self.k.mask_stack.append(mask.name)
        try:
            value = body()
        finally:
            self.k.mask_stack.pop()
        fill = self.constant(other, value.dtype)
        return self.k.emit(f"hl.select({mask}, {value}, {fill})", value.dtype, max(mask.rank, value.rank))

    def indirect_indexing(self, value: CSEVar, size) -> sympy.Symbol:
        k = self.k
        size_text = k.index_text(k.simplify(size))
        key = f"indirect_indexing({value}, {size_text}, {k.mask_stack})"
        found = k.cse.lookup(key)
        if found is not None:
            return sympy.Symbol(found.name, integer=True)
        symbol = indirect_symbol(len(k.indirect))
        k.cse.remember(key, CSEVar(str(symbol), torch.int32, value.rank))
        k.indirect_rank[str(symbol)] = value.rank
        wrapped = f"hl.cast(hl.Int(32), hl.select({value} < 0, {value} + {size_text}, {value}))"
        k.body.writeline(f"{symbol}_unchecked = {wrapped}")
        bounds = f"(0 <= {symbol}_unchecked) & ({symbol}_unchecked < {size_text})"
        if k.mask_stack:  # a lane the mask turns off may hold any index
            bounds = f"{bounds} | ~({' & '.join(k.mask_stack)})"
        if k.schedule.device == "cuda":
            # A GPU kernel cannot stop the pipeline with a message (Halide prints no require in
            # device code); as smelt's Triton kernels on CUDA, whose device_assert is compiled out,
            # it does not check. The index is clamped, so a bad one reads or writes in bounds.
            k.body.writeline(f"{symbol} = hl.clamp({symbol}_unchecked, 0, {size_text} - 1)")
            k.indirect[str(symbol)] = size_text
            return symbol
        # Checked on every access: an index out of range stops the pipeline with this message.
        where = k.current[-1].name if k.current else "?"
        k.body.writeline(f'{symbol} = hl.require({bounds}, {symbol}_unchecked, '
                         f'hl.Expr("index out of bounds in {where}: not in [0, {size_text}):"), {symbol}_unchecked)')
        k.indirect[str(symbol)] = size_text
        return symbol

    def rand(self, seed, offset):
        return random.uniform(self.k, seed, offset)

    def randn(self, seed, offset):
        return random.normal(self.k, seed, offset)

    def randint64(self, seed, offset, low, high):
        return random.randint64(self.k, seed, offset, low, high)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args):
            return self._apply(name, args)
        return op

    def _apply(self, name: str, args) -> CSEVar:
        rank = max(a.rank for a in args)
        if len(args) == 1:
            return self._unary(name, args[0], rank)
        a, b = args
        dtype = torch.promote_types(a.dtype, b.dtype)
        if name in COMPARISONS and _known_index(a) is not None and _known_index(b) is not None \
                and not (a.dtype.is_floating_point or b.dtype.is_floating_point):
            decided = self.k.compare_indices(name, _known_index(a) - _known_index(b))
            if decided is not None:
                return self._known_bool(decided)
        if name in ("logical_and", "logical_or", "logical_xor"):
            a, b = self.to_dtype(a, torch.bool), self.to_dtype(b, torch.bool)
            known = [v for v in (a, b) if isinstance(v, ConstantVar)]
            if known and name != "logical_xor":
                # A side known (a literal, or decided in a piece): and with True, or with False, is the other.
                other = b if known[0] is a else a
                if known[0].value == (name == "logical_and"):
                    return other
                return self._known_bool(name == "logical_or")
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "!="}[name]
            return self.k.emit(f"{self._operand(a)} {op} {self._operand(b)}", torch.bool, rank)
        if name == "truediv" and not dtype.is_floating_point:
            raise UnsupportedInHalide(f"smelt: op truediv on {dtype} (integers) in Halide")
        a, b = self.to_dtype(a, dtype), self.to_dtype(b, dtype)
        if not dtype.is_floating_point and dtype != torch.bool and name in ("floordiv", "remainder"):
            return self._int_floor_op(name, a, b, dtype, rank)
        if name == "truediv" and isinstance(b, ConstantVar) and b.value == 0:
            # Halide rejects a division by a literal zero; eager gives +-inf, or nan for 0 / 0.
            infinity = self.constant(math.copysign(math.inf, b.value), dtype)
            return computed(self.k.emit(f"{self._operand(a)} * {infinity}", dtype, rank), name)
        if name == "truediv" and b.rank == 0 and not isinstance(b, ConstantVar):
            # A scalar Halide may fold to a literal zero while building the Expr (a count of 0):
            # `- 0` hides it from that check and is simplified away later (a zero Halide folds this
            # way divides as +0.0).
            b = CSEVar(f"({b} - {literal(0, dtype)})", dtype, 0)
        if name in ("le", "ge") and dtype.is_floating_point:
            # Halide has no <= node: a <= b is built as !(b < a), true where either is nan (eager: false).
            strict = "<" if name == "le" else ">"
            text = f"({self._operand(a)} {strict} {self._operand(b)}) | ({self._operand(a)} == {self._operand(b)})"
            return computed(self.k.emit(text, torch.bool, rank), name)
        if dtype == torch.bool and name in BOOL_ARITHMETIC:
            return self.k.emit(f"{self._operand(a)} {BOOL_ARITHMETIC[name]} {self._operand(b)}", dtype, rank)
        if name in WRAPPING_INT and register_dtype(dtype) in (torch.int32, torch.int64):
            text = wrapping_int_text(name, self._operand(a), self._operand(b), dtype)
            return computed(self.k.emit(text, dtype, rank), name)
        if name in ("left_shift", "right_shift") and dtype != torch.bool:
            text = shift_text(name, self._operand(a), self._operand(b), dtype)
            return computed(self.k.emit(text, dtype, rank), name)
        if name in INFIX and not (dtype == torch.bool and name in ("sub", "left_shift", "right_shift")):
            out = torch.bool if name in PREDICATE_OPS else dtype
            var = self.k.emit(f"{self._operand(a)} {INFIX[name]} {self._operand(b)}", out, rank)
            if name in QUIETING_BINARY and dtype.is_floating_point and not _folds_to_an_operand(name, a, b) \
                    and self.k.rounds_unguarded(a) and self.k.rounds_unguarded(b):
                self.k.quiet_values.add(var.name)
            return computed(var, name)
        table = FLOAT_BINARY if dtype.is_floating_point else INT_BINARY
        if name == "fmod" and dtype == torch.float64:
            raise UnsupportedInHalide("smelt: op fmod on torch.float64 has no exact Halide form (halide_division.py)")
        if name not in table:
            raise UnsupportedInHalide(f"smelt: op {name} on {dtype} has no Halide form")
        text = table[name].format(a.name, b.name, t=halide_type(register_dtype(dtype)), **signbit_bits(dtype))
        return computed(self.k.emit(text, dtype, rank), name)

    def _unary(self, name: str, x: CSEVar, rank: int) -> CSEVar:
        if name == "logical_not":
            x = self.to_dtype(x, torch.bool)
            if isinstance(x, ConstantVar):
                return self._known_bool(not x.value)
            return self.k.emit(f"~{self._operand(x)}", torch.bool, rank)
        if x.dtype == torch.bool:
            table = BOOL_UNARY
        else:
            table = FLOAT_UNARY if x.dtype.is_floating_point else INT_UNARY
        if name in ("neg", "abs") and x.dtype.is_signed and not x.dtype.is_floating_point:
            return computed(self.k.emit(wrapping_int_unary_text(name, self._operand(x), x.dtype), x.dtype, rank), name)
        if name in ("neg", "abs") and not x.dtype.is_signed and x.dtype != torch.bool:
            # Unsigned: abs is the value, neg wraps (eager's -uint8(1) is 255), as Halide's unsigned 0 - x does.
            zero = f"hl.cast({halide_type(register_dtype(x.dtype))}, 0)"
            text = self._operand(x) if name == "abs" else f"({zero} - {self._operand(x)})"
            return computed(self.k.emit(text, x.dtype, rank), name)
        dtype = torch.bool if name in PREDICATE_OPS else x.dtype
        var = self.k.emit(self.unary_text(name, x, table), dtype, rank)
        if name in QUIETING_UNARY and dtype.is_floating_point and self.k.rounds_unguarded(x):
            self.k.quiet_values.add(var.name)
        return computed(var, name)

    def unary_text(self, name: str, x: CSEVar, table: dict | None = None) -> str:
        """What op `name` on x prints as (and its CSE key)."""
        table = table or (FLOAT_UNARY if x.dtype.is_floating_point else INT_UNARY)
        template = table.get(name)
        if name == "exp" and register_dtype(x.dtype) == torch.float32:
            template = "exp_float32({0}, {at})"  # halide_special.py: one exp, the same bits in every kernel
        if name in FLOAT32_HELPERS and register_dtype(x.dtype) == torch.float32:
            template = name + "_float32({0})"  # special.py: vectorized, not the C library's per element
        if template is None or (name in FLOAT64_UNPRINTED and x.dtype == torch.float64):
            raise UnsupportedInHalide(f"smelt: op {name} on {x.dtype} has no Halide form")
        at = PURE_VARS[0] if self.k.in_update else PURE_VARS[x.rank]
        return template.format(self._operand(x), t=halide_type(register_dtype(x.dtype)), at=at,
                               **signbit_bits(x.dtype))

    def _int_floor_op(self, name, a, b, dtype, rank):
        # Halide's integer / and % are Euclidean (the remainder is never negative); eager floors.
        # They differ only when b < 0 and the remainder is not 0: then q - 1 and r + b.
        q = self.k.emit(f"{self._operand(a)} / {self._operand(b)}", dtype, rank)
        r = self.k.emit(f"{self._operand(a)} % {self._operand(b)}", dtype, rank)
        differs = self.k.emit(f"({r} != 0) & ({self._operand(b)} < 0)", torch.bool, rank)
        if name == "floordiv":
            return self.k.emit(f"hl.select({differs}, {q} - 1, {q})", dtype, rank)
        return self.k.emit(f"hl.select({differs}, {r} + {self._operand(b)}, {r})", dtype, rank)
