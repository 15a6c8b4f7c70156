"""Sizes and index expressions as sympy values, and the rules that simplify them.

Every size and index in smelt is a sympy expression from the start. Static sizes are Integers;
with `dynamic=True` they are the symbols Dynamo's ShapeEnv made (s0, s1, ...), so one compiled
graph serves every value those symbols may take.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Iterable, Sequence

import sympy
from sympy.printing.str import StrPrinter

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    """Integer floor division of two index expressions."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):
            return FloorDiv(base.args[0], base.args[1] * divisor)
        # floor((d*a + b) / d) == a + floor(b / d) for integer a, so whole multiples come out;
        # only while b stays non-negative, as generated code divides like C (toward zero).
        whole, rest = _split_multiples(base, divisor)
        if whole != 0 and (rest == 0 or rest.is_nonnegative):
            return whole + FloorDiv(rest, divisor)
        return None


class ModularIndexing(sympy.Function):
    """(base // divisor) % modulus: the index of one dimension inside a flattened index."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base, divisor, modulus):
        if modulus == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(base) // int(divisor)) % int(modulus))
        if isinstance(base, FloorDiv):
            # One digit form for a dim read through a reshape: (x // a // d) % m == (x // (a*d)) % m,
            # which _recombine can merge with its neighbouring digits.
            return ModularIndexing(base.args[0], base.args[1] * divisor, modulus)
        # Multiples of divisor*modulus contribute whole turns of the modulus: drop them.
        # Also only while the rest stays non-negative: generated code takes % like C.
        whole, rest = _split_multiples(base, divisor * modulus)
        if whole != 0 and (rest == 0 or rest.is_nonnegative):
            return ModularIndexing(rest, divisor, modulus)
        return None


def _split_multiples(expr: Expr, divisor: Expr) -> tuple[Expr, Expr]:
    """Split expr into (sum of terms t/divisor that are integers, the remaining terms)."""
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        quotient = _exact_quotient(term, divisor)
        if quotient is not None and quotient.is_integer:
            whole += quotient
        else:
            rest += term
    return whole, rest


def _powers(expr: Expr) -> tuple[sympy.Integer, Counter] | None:
    """expr as (integer coefficient, {factor: non-negative integer power}), or None."""
    coeff, factors = expr.as_coeff_mul()
    if not coeff.is_Integer:
        return None
    powers = Counter()
    for f in factors:
        base, exp = f.as_base_exp()
        if not exp.is_Integer or exp < 0:
            return None
        powers[base] += int(exp)
    return coeff, powers


def _exact_quotient(term: Expr, divisor: Expr) -> Expr | None:
    """term / divisor when the divisor's factors are among the term's own (a product left), else
    None. Matched factor by factor, not by sympy.cancel: cancel walks the whole term, and a term
    holding index functions nested through a chain of reshapes (OPT's attention, at 768 wide)
    took it minutes."""
    t, d = _powers(term), _powers(divisor)
    if t is None or d is None or d[0] == 0 or t[0] % d[0] != 0:
        return None
    (t_coeff, t_powers), (d_coeff, d_powers) = t, d
    for base, exp in d_powers.items():
        if t_powers[base] < exp:
            return None
        t_powers[base] -= exp
    return sympy.Integer(int(t_coeff) // int(d_coeff)) * sympy.Mul(*[b ** e for b, e in t_powers.items() if e])


def sizes_in_value_math(expr: Expr, index_vars: Iterable[sympy.Symbol]) -> set:
    """The symbols of `expr` (sizes: not `index_vars`, not indirect positions) it uses outside a
    FloorDiv or ModularIndexing. Those parts are bounded by the kernel's own sizes; the rest is
    arithmetic on sizes, which a value (`torch.full((2,), n * n * 3)`) may take past int32 where
    the kernel's index math runs in int32."""
    stripped = sympify(expr).replace(lambda e: isinstance(e, (FloorDiv, ModularIndexing)), lambda e: sympy.S.Zero)
    return {s for s in stripped.free_symbols if s not in set(index_vars) and not s.name.startswith("indirect")}


def index_var(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def sympify(value) -> Expr:
    """A size given as int, SymInt or sympy expression, as a sympy expression."""
    if isinstance(value, sympy.Basic):
        return value
    node = getattr(value, "node", None)
    if node is not None and hasattr(node, "expr"):
        return node.expr
    return sympy.Integer(int(value))


def product(values: Iterable) -> Expr:
    result = sympy.Integer(1)
    for v in values:
        result = result * sympify(v)
    return result


def contiguous_strides(size: Sequence[Expr]) -> list[Expr]:
    strides, running = [], sympy.Integer(1)
    for s in reversed(size):
        strides.append(running)
        running = running * s
    return list(reversed(strides))


def static_int(expr: Expr | None) -> int | None:
    """The value of expr if it has no free symbols, else None (and None for None)."""
    if expr is None:
        return None
    expr = sympify(expr)
    return int(expr) if expr.is_Integer else None


def static_ints(exprs: Sequence[Expr]) -> list[int] | None:
    """The values of `exprs` if none has free symbols, else None."""
    values = [static_int(e) for e in exprs]
    return None if any(v is None for v in values) else values


def flat_index(index: Sequence[Expr], size: Sequence[Expr]) -> Expr:
    return sum((i * s for i, s in zip(index, contiguous_strides(size))), sympy.Integer(0))


def reshape_indexer(old: Sequence[Expr], new: Sequence[Expr]):
    """index into a reshape to `new` -> index into its input of size `old`, dim group by dim group.

    Dims pair up in runs whose sizes multiply to the same ((s, h*d) -> (s, h, d): s alone, then h*d
    split in two), so a split reads i_h*d + i_d and a merge one digit of one index: small
    expressions however many reshapes a value goes through. The flat-index form (unflatten of the
    whole flattened index) nests a level per reshape, which sympy took minutes over in OPT.
    None when the runs cannot be matched (sizes that do not divide each other); the caller then
    uses the flat form."""
    old_dims = [d for d, s in enumerate(old) if s != 1]
    new_dims = [d for d, s in enumerate(new) if s != 1]
    groups, a, b = [], 0, 0
    while a < len(old_dims) and b < len(new_dims):
        og, ng = [old_dims[a]], [new_dims[b]]
        po, pn = sympify(old[og[0]]), sympify(new[ng[0]])
        a, b = a + 1, b + 1
        while sympy.expand(po - pn) != 0:
            if _exact_quotient(pn, po) is not None and a < len(old_dims):
                og.append(old_dims[a])
                po, a = po * old[old_dims[a]], a + 1
            elif _exact_quotient(po, pn) is not None and b < len(new_dims):
                ng.append(new_dims[b])
                pn, b = pn * new[new_dims[b]], b + 1
            else:
                return None
        groups.append((og, ng))
    if a != len(old_dims) or b != len(new_dims):
        return None

    def reindex(index: Sequence[Expr]) -> list[Expr]:
        out = [sympy.Integer(0)] * len(old)
        for og, ng in groups:
            flat = flat_index([index[d] for d in ng], [new[d] for d in ng])
            for d, e in zip(og, unflatten_index(flat, [old[d] for d in og]) if len(og) > 1 else [flat]):
                out[d] = e
        return out
    return reindex


def unflatten_index(flat: Expr, size: Sequence[Expr]) -> list[Expr]:
    """The per-dimension indices of a row-major flat index over `size`."""
    out, divisor = [], sympy.Integer(1)
    for s in reversed(size):
        out.append(sympy.Integer(0) if s == 1 else ModularIndexing(flat, divisor, s))
        divisor = divisor * s
    return list(reversed(out))


# ---------------------------------------------------------------- range-aware simplification


def _upper_bound(expr: Expr, ranges: dict) -> Expr | None:
    """An inclusive upper bound of a non-negative index expression, or None when unknown."""
    if expr.is_Integer:
        return expr
    if expr in ranges:
        return ranges[expr] - 1
    if expr.is_Symbol:
        return None
    if isinstance(expr, ModularIndexing):
        return expr.args[2] - 1
    if isinstance(expr, FloorDiv):
        ub = _upper_bound(expr.args[0], ranges)
        return None if ub is None else FloorDiv(ub, expr.args[1])
    if expr.is_Add:
        total = sympy.Integer(0)
        for a in expr.args:
            ub = _upper_bound(a, ranges)
            if ub is None or not _nonnegative(a):
                return None
            total += ub
        return total
    if expr.is_Mul:
        coeff, rest = expr.as_coeff_Mul()
        if coeff > 0 and not rest.is_Mul:
            ub = _upper_bound(rest, ranges)
            return None if ub is None else coeff * ub
        # A product of size symbols and one index var: bound by the product of bounds.
        total = sympy.Integer(1)
        for a in expr.args:
            ub = a if (a.is_Symbol and a not in ranges and a.is_positive) else _upper_bound(a, ranges)
            if ub is None:
                return None
            total *= ub
        return total
    return None


def surely_below(expr: Expr, ranges: dict, limit: int) -> bool:
    """Whether an index expression lies in [0, limit) for every index var v of `ranges` in
    [0, ranges[v]) (static sizes): provably, else False."""
    if not _never_negative(expr, ranges):
        return False
    upper = _upper_bound(expr, {v: sympy.Integer(n) for v, n in ranges.items()})
    return upper is not None and sympy.sympify(upper).is_Integer and int(upper) < limit


def index_bounds(expr: sympy.Expr, ranges: dict) -> tuple[int, int] | None:
    """Inclusive integer bounds of an index expression for each index var v of `ranges` in
    [0, ranges[v]): a constant plus terms that are each an integer multiple of a non-negative
    expression with a known bound (its least value taken as 0); None where a term is not."""
    ranges = {v: sympy.Integer(n) for v, n in ranges.items()}
    constant, rest = sympy.sympify(expr).as_coeff_Add()
    if not constant.is_Integer:
        return None
    low = high = int(constant)
    for term in sympy.Add.make_args(rest):
        if term == 0:
            continue
        coefficient, factor = term.as_coeff_Mul()
        top = _upper_bound(factor, ranges)
        if not coefficient.is_Integer or not _never_negative(factor, ranges) or top is None \
                or not sympy.sympify(top).is_Integer:
            return None
        if coefficient > 0:
            high += int(coefficient) * int(top)
        else:
            low += int(coefficient) * int(top)
    return low, high


def _never_negative(expr: Expr, ranges: dict) -> bool:
    """Provably >= 0 with the index vars of `ranges` >= 0 (a Mod or floor of a negative base is
    printed as C's, so its base must be too)."""
    if expr.is_Integer:
        return expr >= 0
    if expr in ranges:
        return True
    if isinstance(expr, (FloorDiv, ModularIndexing)):
        return _never_negative(expr.args[0], ranges) and all(bool(a.is_positive) for a in expr.args[1:])
    if expr.is_Add or expr.is_Mul:
        return all(_never_negative(a, ranges) for a in expr.args)
    return False


def _nonnegative(expr: Expr) -> bool:
    return bool(expr.is_nonnegative) or (expr.is_Mul and expr.as_coeff_Mul()[0] > 0)


def _less_than(a: Expr | None, b: Expr) -> bool:
    if a is None:
        return False
    return bool(sympy.simplify(b - a).is_positive)


def simplify_index(expr: Expr, ranges: dict) -> Expr:
    """Simplify expr knowing each index var v of `ranges` lies in [0, ranges[v])."""
    # Remembered: kernels of one graph (an optimizer's hundreds of per-tensor kernels) ask for
    # the same index under the same ranges again and again, and each answer costs sympy work.
    items = tuple(ranges.items())
    # A constant term is left out and added back: the taps of a window (a depthwise convolution's
    # 25 loads) differ by one, and share one simplification of the rest.
    constant, rest = expr.as_coeff_Add() if isinstance(expr, sympy.Add) else (0, expr)
    if constant != 0 and constant.is_Integer:
        return _simplify_index(rest, items) + constant
    return _simplify_index(expr, items)


@functools.lru_cache(maxsize=8192)
def _simplify_index(expr: Expr, range_items: tuple) -> Expr:
    ranges = dict(range_items)

    def visit(e: Expr) -> Expr:
        if not e.args:
            return e
        e = e.func(*[visit(a) for a in e.args])
        if isinstance(e, ModularIndexing):
            base, div, mod = e.args
            if _less_than(_upper_bound(base, ranges), div * mod):
                return visit(FloorDiv(base, div))
        if isinstance(e, ModularIndexing) and e.args[1] != 1:
            reduced = _drop_small_part(e.args[0], e.args[1], ranges)
            if reduced is not None:
                return visit(ModularIndexing(reduced[0], reduced[1], e.args[2]))
        if isinstance(e, ModularIndexing) and e.args[1] == 1:
            split = _low_part_apart(e.args[0], e.args[2], ranges)
            if split is not None:
                f, y, low = split
                return visit(f * ModularIndexing(y, 1, sympy.cancel(e.args[2] / f)) + low)
        if isinstance(e, FloorDiv):
            base, div = e.args
            if _less_than(_upper_bound(base, ranges), div):
                return sympy.Integer(0)
            # (d*a + b) // d == a when 0 <= b < d
            whole, rest = _split_multiples(base, div)
            if whole != 0 and (rest == 0 or rest.is_nonnegative) and _less_than(_upper_bound(rest, ranges), div):
                return whole
            reduced = _drop_small_part(base, div, ranges)
            if reduced is not None:
                return visit(FloorDiv(*reduced))
        return e

    if not expr.has(FloorDiv, ModularIndexing):
        return sympy.expand_mul(expr)  # linear: nothing to fold
    return _recombine(sympy.expand_mul(visit(sympy.expand_mul(expr))))


def _drop_small_part(base: Expr, div: Expr, ranges: dict):
    """(y, div/f) when base == f*y + r with 0 <= r < f for some factor f of div, else None.

    Then base // div == y // (div/f): the low part r never carries into the quotient.
    """
    terms = sympy.Add.make_args(base)
    for term in terms:
        f = sympy.gcd(term.as_coeff_Mul()[0] * sympy.Mul(*[a for a in sympy.Mul.make_args(term)
                                                           if a.is_Symbol and a not in ranges]), div)
        if f == 1:
            continue
        y, r = _split_multiples(base, f)
        if y != 0 and r != 0 and r.is_nonnegative and _less_than(_upper_bound(r, ranges), f):
            return y, sympy.cancel(div / f)
    return None


def _low_part_apart(base: Expr, mod: Expr, ranges: dict):
    """(f, y, r) when base == f*y + r with 0 <= r < f for some factor f of mod, else None.

    Then base % mod == f*(y % (mod/f)) + r: the low part never reaches the modulus. A split
    reduction's chunk (1024*x + r) % 4096 becomes 1024*(x % 4) + r, which _recombine folds with
    its row's 4096*(x // 4) back into 1024*x + r.
    """
    for term in sympy.Add.make_args(base):
        f = sympy.gcd(term.as_coeff_Mul()[0], mod)
        if f == 1:
            continue
        y, r = _split_multiples(base, f)
        if y != 0 and r != 0 and r.is_nonnegative and _less_than(_upper_bound(r, ranges), f):
            return f, y, r
    return None


def _split_index_factor(term: Expr):
    """(multiplier, FloorDiv/ModularIndexing factor) of a product term, or None."""
    factors = sympy.Mul.make_args(term)
    for k, factor in enumerate(factors):
        if isinstance(factor, (FloorDiv, ModularIndexing)):
            return sympy.Mul(*factors[:k], *factors[k + 1:]), factor
    return None


def _recombine(expr: Expr) -> Expr:
    """Undo the split of one index into digits: c*b*(x // (a*b)) + c*((x // a) % b) == c*(x // a).

    Reshapes that split and re-merge a dimension produce these pairs; folding them turns a
    contiguous access back into a plain linear index.
    """
    while True:
        terms = list(sympy.Add.make_args(expr))
        split = [_split_index_factor(t) for t in terms]
        if sum(si is not None for si in split) < 2:
            return expr  # a fold takes two digits
        merged = None
        for i, si in enumerate(split):
            if si is None or not isinstance(si[1], ModularIndexing):
                continue
            c, (x, a, b) = si[0], si[1].args
            for j, sj in enumerate(split):
                if j == i or sj is None or sympy.expand(sj[0] - c * b) != 0:
                    continue
                other = sj[1]
                if isinstance(other, FloorDiv) and other.args[0] == x and sympy.expand(other.args[1] - a * b) == 0:
                    merged = (i, j, c * FloorDiv(x, a))
                elif (isinstance(other, ModularIndexing) and other.args[0] == x
                      and sympy.expand(other.args[1] - a * b) == 0):
                    merged = (i, j, c * ModularIndexing(x, a, b * other.args[2]))
                if merged:
                    break
            if merged:
                break
        if merged is None:
            return expr
        i, j, replacement = merged
        expr = sum((t for k, t in enumerate(terms) if k not in (i, j)), sympy.Integer(0)) + replacement


# ---------------------------------------------------------------- printing


class IndexPrinter(StrPrinter):
    """Prints index expressions as Python/Triton integer code."""

    def _operand(self, e):
        text = self._print(e)
        return text if (e.is_Atom or isinstance(e, sympy.Function)) else f"({text})"

    def _print_FloorDiv(self, e):
        return f"({self._operand(e.args[0])} // {self._operand(e.args[1])})"

    def _print_ModularIndexing(self, e):
        base, div, mod = e.args
        inner = self._operand(base) if div == 1 else f"({self._operand(base)} // {self._operand(div)})"
        return f"({inner} % {self._operand(mod)})"

    # Dynamo's sizes hold torch's sympy functions too (a CUDA kernel's output padded to 8 is
    # `s - Mod(s, 8) + 8`). Sizes are never negative, so C's and Python's remainders agree.
    def _print_Mod(self, e):
        return f"({self._operand(e.args[0])} % {self._operand(e.args[1])})"

    _print_PythonMod = _print_Mod
    _print_CleanDiv = _print_FloorDiv

    def _print_Pow(self, e):
        base, exp = e.args
        if exp.is_Integer and exp > 0:
            return "(" + " * ".join([self._operand(base)] * int(exp)) + ")"
        raise NotImplementedError(f"smelt: cannot print index power {e}")

    _print_PowByNatural = _print_Pow

    def _print_TruncToInt(self, e):
        return f"int({self._print(e.args[0])})"

    # A SymFloat's functions (BatchNorm's unbiased n / (n - 1) under dynamic shapes), printed as Python
    # for the wrapper: ops reading such a value run in ATen (lowering/graph.py), never in a kernel.
    def _print_FloatTrueDiv(self, e):
        return f"({self._operand(e.args[0])} / {self._operand(e.args[1])})"

    _print_IntTrueDiv = _print_FloatTrueDiv

    def _print_ToFloat(self, e):
        return f"float({self._print(e.args[0])})"

    def _print_FloatPow(self, e):
        return f"({self._operand(e.args[0])} ** {self._operand(e.args[1])})"

    def _print_TruncToFloat(self, e):
        return f"float(math.trunc({self._print(e.args[0])}))"

    def _print_Function(self, e):
        raise NotImplementedError(f"smelt: cannot print {type(e).__name__} in the index or size expression {e}")

    def _print_Max(self, e):
        return functools.reduce(lambda a, b: f"max({a}, {b})", (self._print(a) for a in e.args))

    def _print_Min(self, e):
        return functools.reduce(lambda a, b: f"min({a}, {b})", (self._print(a) for a in e.args))

    def _print_CeilToInt(self, e):
        return f"math.ceil({self._print(e.args[0])})"

    def _print_FloorToInt(self, e):
        return f"math.floor({self._print(e.args[0])})"


_printer = IndexPrinter()


def pexpr(expr) -> str:
    return _printed(sympify(expr))


@functools.lru_cache(maxsize=16384)
def _printed(expr: Expr) -> str:
    return _printer.doprint(expr)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def dense_dim_order(size, stride) -> list[int] | None:
    """The dims from outermost to innermost if static (size, stride) covers its storage exactly
    once (a permutation of a contiguous layout), else None."""
    order = sorted((d for d in range(len(size)) if size[d] != 1), key=lambda d: -stride[d])
    expected = 1
    for d in reversed(order):
        if stride[d] != expected:
            return None
        expected *= size[d]
    return order
