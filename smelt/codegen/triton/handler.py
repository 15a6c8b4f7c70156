"""The ops vocabulary printed as Triton expressions: the handler a kernel's values are computed
through (codegen/triton/kernel.py), also used by its scan and scatter helpers."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import sympy
import torch

from ...ir.ops import indirect_symbol
from ...symbolic import static_int
from ..common import CSEVar, computed, register_dtype
from .ops import (APPROX_SQRT_F32, APPROX_SQRT_F32_INTERPRETED, COMMON_UNARY, FLOAT32_DIV, FLOAT32_UNARY,
                  FLOAT_BINARY, FLOAT_UNARY, INFIX, INT_BINARY, INT_UNARY, PREDICATE_OPS, literal, triton_type)
from .random import normal, randint64, uniform

if TYPE_CHECKING:
    from .kernel import TritonKernel


INT32_LIMIT = 2 ** 31 - 1
NEGATIVE_ZERO_BITS = {torch.float32: (-2 ** 31, "tl.int32"), torch.float64: (-2 ** 63, "tl.int64")}
_graph_int64: dict = {}  # id(graph) -> (graph, answer): asked once per kernel, the graph's part is the same


def graph_needs_int64(graph) -> bool:
    """Whether some buffer or input of the graph is symbolic or too big for int32 offsets."""
    cached = _graph_int64.get(id(graph))
    if cached is not None and cached[0] is graph:
        return cached[1]
    sizes = [b.layout.storage_numel() for b in graph.buffers if b.layout is not None]
    sizes += [s.layout.storage_numel() for s in getattr(graph, "shared_storages", {}).values()]
    sizes += [v.layout.storage_numel() for _, v in graph.inputs if v is not None and hasattr(v, "layout")]
    answer = any(static_int(s) is None or static_int(s) > INT32_LIMIT for s in sizes)
    _graph_int64.clear()  # one graph is generated at a time: keep only its answer
    _graph_int64[id(graph)] = (graph, answer)
    return answer


class TritonOps:
    """The ops vocabulary printed as Triton expressions inside one kernel."""

    approximates = True  # approx_truediv / approx_sqrt take Triton's own float32 `/` and sqrt (ir/ops.py)

    def __init__(self, kernel: TritonKernel):
        self.k = kernel

    def _const(self, text: str, dtype: torch.dtype, typed_wide_ints: bool = False) -> CSEVar:
        """`typed_wide_ints`: an int64 value is spelled with its type even where it fits int32, so that
        an expression of literals alone is computed in int64 (where(c, 2**31 - 1, 7) + 1 wrapped)."""
        if dtype == torch.float64 and text != "-0.0":  # (-0.0 keeps its sign bit only as _operand spells it)
            # Triton makes a Python float a float32 where no float64 operand meets it, as in an
            # expression of literals only (lerp's weight 0.3 was rounded; ones(n) / 3 was divided
            # in float32): spelled as a float64.
            return self.k.emit(f"tl.full([], {text}, tl.float64)", dtype, 0)
        if dtype in (torch.int64, torch.uint32, torch.uint64) and (typed_wide_ints or not -2 ** 31 <= int(text) < 2 ** 31):
            # Likewise an int past int32 meeting a value Triton holds as int32 (an argmax's index,
            # an expression of small literals) is refused: spelled with its type, it widens them.
            return self.k.emit(f"tl.full([], {text}, {triton_type(dtype)})", dtype, 0)
        return CSEVar(text, dtype, 0)

    def _libdevice_operand(self, v: CSEVar, dtype: torch.dtype) -> str:
        """An operand of a float op computed in `dtype`'s registers. libdevice picks its overload by
        its operands' types, and on the GPU a Python float is a float32 constant: fmod(a float64
        tensor, 3.0) found no (fp64, fp32) overload and did not compile (the interpreter ran it).
        So a literal is spelled with the op's type."""
        if not _is_literal(v.name):
            return self._operand(v)
        reg = register_dtype(dtype)
        if v.name == "-0.0":  # spelled out by its bits, in the op's type (see _operand)
            return self._operand(CSEVar(v.name, reg, 0))
        return f"tl.full([], {v.name}, {triton_type(reg)})"

    def _operand(self, v: CSEVar) -> str:
        text = v.name
        if text == "-0.0" and register_dtype(v.dtype) in NEGATIVE_ZERO_BITS:
            # Triton 3.6 folds a -0.0 literal into an earlier 0.0 in the same kernel (x / -0.0 gave
            # +inf on the H100): the sign bit is spelled out instead.
            bits, itype = NEGATIVE_ZERO_BITS[register_dtype(v.dtype)]
            return f"tl.full([], {bits}, {itype}).to({triton_type(register_dtype(v.dtype))}, bitcast=True)"
        return f"({text})" if text.startswith("-") or " " in text else text

    def load(self, name, index):
        return self.k.load(name, self.k.simplify(index))

    def constant(self, value, dtype):
        # (index constants stay plain: index math is int32 where sizes allow)
        return self._const(literal(value, dtype), dtype, typed_wide_ints=True)

    def index_expr(self, expr, dtype):
        expr = self.k.simplify(expr)
        if expr.is_Integer:
            return self._const(str(int(expr)), dtype)
        text = self.k.index_text(expr, wide=dtype == torch.int64)
        if triton_type(dtype) != self.k.index_dtype:  # index math runs in int32 where sizes allow
            text = f"({text}).to({triton_type(dtype)})"
        value = self.k.emit(text, dtype, self.k.rank_of(expr))
        self.k.index_exprs[value.name] = expr
        return value

    def to_dtype(self, x: CSEVar, dtype: torch.dtype) -> CSEVar:
        if x.dtype == dtype:
            return x
        if x.rank == 0 and _is_literal(x.name):
            value = _literal_value(x.name)
            if dtype in (torch.float16, torch.bfloat16):
                # Rounded as eager converts: a half float's literal is printed in float32, which
                # would keep every digit (torch.tensor(0.1).half() read 0.1, not 0.0999755859375).
                value = torch.tensor(value, dtype=x.dtype).to(dtype).item()
            return self._const(literal(value, dtype), dtype)
        if dtype == torch.bool:
            return self.k.emit(f"{self._operand(x)} != 0", dtype, x.rank)
        src, dst = register_dtype(x.dtype), register_dtype(dtype)
        if dst == src:
            if dst != dtype:  # a half-float cast: round through the narrow type
                return self.k.emit(f"{self.k.cast(x.name, src, dtype)}.to({triton_type(dst)})", dtype, x.rank)
            return CSEVar(x.name, dtype, x.rank)
        text = f"{self._operand(x)}.to({triton_type(dst)})"
        if src.is_floating_point and dst == torch.uint8:
            # Eager converts a float to uint8 through int64, then wraps (-1.5 -> 255); a direct
            # conversion saturates on CUDA (0).
            text = f"{self._operand(x)}.to(tl.int64).to(tl.uint8)"
        if dst != dtype:
            text = f"{self.k.cast(self._operand(x), src, dtype)}.to({triton_type(dst)})"
        return self.k.emit(text, dtype, x.rank)

    def where(self, cond, a, b):
        dtype = torch.promote_types(a.dtype, b.dtype)
        a = self._typed_beside_literal(a, b, dtype)
        return self.k.emit(f"tl.where({cond}, {a}, {b})", dtype, max(cond.rank, a.rank, b.rank))

    def _typed_beside_literal(self, a: CSEVar, b: CSEVar, dtype: torch.dtype) -> CSEVar:
        """a, spelled with `dtype`'s type where a and b are both literals: Triton makes where(c, 0, 0)
        or 1 * 2 an int32 (float32) value, and a uint8 value built from one met a uint8 in `//` or `%`
        and did not compile (fuzzer, H100 and CPU); an int8 one would not wrap."""
        reg = register_dtype(dtype)
        if reg in (torch.int32, torch.float32, torch.bool) or not _both_literal(a, b):
            return a
        return self.k.emit(f"tl.full([], {a.name}, {triton_type(reg)})", dtype, 0)

    def indirect_indexing(self, value: CSEVar, size) -> sympy.Symbol:
        k = self.k
        size_text = k.index_text(k.simplify(size))
        mask = k.mask_for(value.rank) if value.rank else None
        key = f"indirect_indexing({value}, {size_text}, {mask})"  # e.g. a scatter's and a gather's same index
        if k.cse.lookup(key) is not None:
            return sympy.Symbol(k.cse.lookup(key).name, integer=True)
        symbol = indirect_symbol(len(k.indirect_ranks))
        k.cse.remember(key, CSEVar(str(symbol), torch.int64, value.rank))
        # Negative indices count from the end, as in eager.
        k.body.writeline(f"{symbol} = tl.where({value} < 0, {value} + {size_text}, {value})")
        bounds = f"(0 <= {symbol}) & ({symbol} < {size_text})"
        if mask:
            bounds += f" | ~({mask})"
        if k.reads_rows_without_r(value.rank):  # an index read for empty rows may be anything
            bounds += " | (rnumel <= 0)"
        check = f'{bounds}, "index out of bounds: not in [0, {size_text})"'
        if k.interpret:
            # The interpreter drops tl.device_assert: its own check raises (interpreter_libdevice.py).
            k.body.writeline(f"libdevice.check_index({check})")
        else:
            # Such a kernel compiles in Triton's debug mode, which keeps the check (runtime/triton_cubin.compile_options).
            k.body.writeline(f"tl.device_assert({check})")
        k.indirect_ranks[str(symbol)] = value.rank
        return symbol

    def rand(self, seed, offset):
        return uniform(self.k, seed, offset, self.k.index_exprs.get(offset.name))

    def randn(self, seed, offset):
        return normal(self.k, seed, offset)

    def randint64(self, seed, offset, low, high):
        return randint64(self.k, seed, offset, low, high)

    def masked(self, mask, body, other):
        self.k.mask_stack.append(mask.name)
        self.k.mask_ranks[mask.name] = mask.rank
        try:
            value = body()
        finally:
            self.k.mask_stack.pop()
        fill = self.constant(other, value.dtype)
        value = self._typed_beside_literal(value, fill, value.dtype)
        return self.k.emit(f"tl.where({mask}, {value}, {fill})", value.dtype, max(mask.rank, value.rank))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args):
            return self._apply(name, args)
        return op

    def _apply(self, name: str, args) -> CSEVar:
        rank = max(a.rank for a in args)
        if len(args) == 1:
            (x,) = args
            if name == "logical_not":
                return self.k.emit(f"{self._operand(x)} == 0", torch.bool, rank)
            if name == "sign":
                # Literals of the value's own type: no int -> float conversion to get wrong (bf16 on the GPU).
                reg = register_dtype(x.dtype)
                one, minus_one, zero = literal(1, reg), literal(-1, reg), literal(0, reg)
                text = f"tl.where({x} > {zero}, {one}, tl.where({x} < {zero}, {minus_one}, {zero}))"
                if reg != torch.float32:  # literals alone are float32 (or int32) in Triton
                    text += f".to({triton_type(reg)})"
                return self.k.emit(text, x.dtype, rank)
            operand = self._operand(x)
            if _is_literal(x.name):  # libdevice calls take tensors (the interpreter's nearbyint(1.0) raised)
                operand = f"tl.full([], {x.name}, {triton_type(register_dtype(x.dtype))})"
            if name == "approx_sqrt":
                if register_dtype(x.dtype) == torch.float32:
                    template = APPROX_SQRT_F32_INTERPRETED if self.k.interpret else APPROX_SQRT_F32
                    return computed(self.k.emit(template.format(operand), x.dtype, rank), name)
                name = "sqrt"
            if name == "neg" and x.dtype.is_floating_point:
                # Triton before 3.7 spells `-x` as `0 - x`, which gives +0 for +0; a product by -1 flips
                # the sign bit of every value, zero included (atan2(-x, y) and copysign read it).
                reg = register_dtype(x.dtype)
                text = f"{operand} * {literal(-1, reg)}"
                if reg != torch.float32:  # a float literal is float32 in Triton
                    text = f"({text}).to({triton_type(reg)})"
                return computed(self.k.emit(text, x.dtype, rank), name)
            table = FLOAT_UNARY if x.dtype.is_floating_point else INT_UNARY
            if register_dtype(x.dtype) == torch.float32 and name in FLOAT32_UNARY:
                table = FLOAT32_UNARY
            template = table.get(name) or COMMON_UNARY.get(name)
            if template is None:
                raise NotImplementedError(f"smelt: op {name} on {x.dtype} has no Triton form")
            dtype = torch.bool if name in PREDICATE_OPS else x.dtype
            return computed(self.k.emit(template.format(operand), dtype, rank), name)
        a, b = args
        dtype = torch.promote_types(a.dtype, b.dtype)
        a = self._typed_beside_literal(a, b, dtype)  # `1 * 2` is an int32 in Triton: a uint8 add's alpha
        if name in ("logical_and", "logical_or", "logical_xor"):
            a, b = self.to_dtype(a, torch.bool), self.to_dtype(b, torch.bool)
            name = {"logical_and": "bitwise_and", "logical_or": "bitwise_or", "logical_xor": "bitwise_xor"}[name]
            dtype = torch.bool
        if dtype == torch.bool and name in ("add", "mul"):  # eager: True + True is True; an i1 add wraps
            name = {"add": "bitwise_or", "mul": "bitwise_and"}[name]
        if dtype == torch.bool and name in ("bitwise_and", "bitwise_or", "bitwise_xor") and self.k.interpret \
                and a.rank != b.rank and not (_is_literal(a.name) or _is_literal(b.name)):
            # The interpreter's numpy cannot combine a loaded bool scalar with a bool block.
            text = f"({a}.to(tl.int8) {INFIX[name]} {b}.to(tl.int8)) != 0"
            return self.k.emit(text, torch.bool, rank)
        if not dtype.is_floating_point and name in ("floordiv", "remainder"):
            return self._int_floor_op(name, a, b, dtype, rank)
        if dtype.is_floating_point and name == "remainder":
            q = self.k.emit(f"tl.floor({self._divide(a, b, dtype)})", dtype, rank)
            return computed(self.k.emit(f"{self._operand(a)} - {q} * {self._operand(b)}", dtype, rank), name)
        if name in ("truediv", "approx_truediv") and dtype.is_floating_point:
            return computed(self.k.emit(self._divide(a, b, dtype, exact=name == "truediv"), dtype, rank), name)
        if name in ("left_shift", "right_shift") and dtype != torch.bool:
            # Eager shifts everything out by the width or more, or by a negative count; LLVM's shift
            # is poison there.
            bits, x, count = dtype.itemsize * 8, self._operand(a), self._operand(b)
            outside = f"({count} >= {literal(bits, dtype)})" + (f" | ({count} < 0)" if dtype.is_signed else "")
            if name == "left_shift":
                text = f"tl.where({outside}, 0, {x} << {count})"
            else:
                fill = f"{x} >> {literal(bits - 1, dtype)}" if dtype.is_signed else "0"  # -1 or 0 by the sign
                text = f"tl.where({outside}, {fill}, {x} >> {count})"
            return computed(self.k.emit(text, dtype, rank), name)
        if name in INFIX:
            out = torch.bool if name in PREDICATE_OPS else dtype
            return computed(self.k.emit(f"{self._operand(a)} {INFIX[name]} {self._operand(b)}", out, rank), name)
        if name == "floordiv" and dtype.is_floating_point:
            return computed(self.k.emit(f"tl.floor({self._divide(a, b, dtype)})", dtype, rank), name)
        table = FLOAT_BINARY if dtype.is_floating_point else INT_BINARY
        if name not in table:
            raise NotImplementedError(f"smelt: op {name} on {dtype} has no Triton form")
        if table is FLOAT_BINARY:
            a, b = self._libdevice_operand(a, dtype), self._libdevice_operand(b, dtype)
        return computed(self.k.emit(table[name].format(a, b), dtype, rank), name)

    def _divide(self, a, b, dtype, exact: bool = True) -> str:
        """a / b in `dtype`, correctly rounded (see FLOAT32_DIV); not exact: Triton's `/`, div.full.f32
        for float32 on the GPU (2 ulp)."""
        if register_dtype(dtype) == torch.float32 and not _both_literal(a, b):
            a, b = (v if register_dtype(v.dtype) == torch.float32 else self.to_dtype(v, torch.float32) for v in (a, b))
            reciprocal = _power_of_two_reciprocal(b.name)
            if reciprocal is not None:  # x * 2**-k is x / 2**k exactly, subnormal results too: one rounding of one value
                return f"{self._operand(a)} * {reciprocal!r}"
            if exact:
                return FLOAT32_DIV.format(self._operand(a), self._operand(b))
        return f"{self._operand(a)} / {self._operand(b)}"

    def _int_floor_op(self, name, a, b, dtype, rank):
        # Triton's integer // and % truncate toward zero; eager floors. Correct by one where they differ.
        q = self.k.emit(f"{self._operand(a)} // {self._operand(b)}", dtype, rank)
        r = self.k.emit(f"{self._operand(a)} - {q} * {self._operand(b)}", dtype, rank)
        differs = self.k.emit(f"({r} != 0) & (({r} < 0) != ({self._operand(b)} < 0))", torch.bool, rank)
        if name == "floordiv":
            return self.k.emit(f"tl.where({differs}, {q} - 1, {q})", dtype, rank)
        return self.k.emit(f"tl.where({differs}, {r} + {self._operand(b)}, {r})", dtype, rank)


def _both_literal(a, b) -> bool:
    return _is_literal(a.name) and _is_literal(b.name)


def _power_of_two_reciprocal(text: str) -> float | None:
    """1 / v for a literal v = +-2**k whose reciprocal is a normal float32, else None."""
    if not _is_literal(text):
        return None
    value = _literal_value(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0 or not math.isfinite(value):
        return None
    mantissa, exponent = math.frexp(abs(value))
    if mantissa != 0.5 or not -126 <= 1 - exponent <= 127:
        return None
    return 1.0 / value


def _is_literal(text: str) -> bool:
    try:
        _literal_value(text)
        return True
    except (ValueError, SyntaxError, NameError):
        return False


def _literal_value(text: str):
    return eval(text, {"float": float, "__builtins__": {}})  # only literals we printed ourselves
