"""simplify_index against brute force: every rewrite must keep each value of the index."""
import itertools

import pytest
import sympy

from smelt.symbolic import FloorDiv, ModularIndexing, index_var, simplify_index, surely_below

X, R = index_var("xindex"), index_var("rindex")


def _value(expr, x, r):
    def visit(e):
        if isinstance(e, FloorDiv):
            return visit(e.args[0]) // visit(e.args[1])
        if isinstance(e, ModularIndexing):
            return (visit(e.args[0]) // visit(e.args[1])) % visit(e.args[2])
        if e.args:
            return e.func(*[sympy.Integer(visit(a)) for a in e.args])
        return {X: x, R: r}.get(e, e)
    return int(visit(expr))


CASES = [
    # A split reduction's chunk of a 64x64 matrix: row and column of 16*x + r.
    (64 * FloorDiv(16 * X + R, 64) + ModularIndexing(16 * X + R, 1, 64), 256, 16, "16*xindex + rindex"),
    (ModularIndexing(16 * X + R, 1, 64), 256, 16, None),
    (ModularIndexing(6 * X + R, 1, 4), 40, 2, None),
    (ModularIndexing(16 * X + R, 1, 64), 256, 32, None),  # r reaches past the factor: kept
    (FloorDiv(16 * X + R, 64), 256, 16, None),
]


@pytest.mark.parametrize("expr, xs, rs, expected", CASES)
def test_simplified_index_keeps_every_value(expr, xs, rs, expected):
    simple = simplify_index(expr, {X: xs, R: rs})
    for x, r in itertools.product(range(xs), range(rs)):
        assert _value(simple, x, r) == _value(expr, x, r), (simple, x, r)
    if expected is not None:
        assert simple == sympy.sympify(expected, locals={"xindex": X, "rindex": R})


def test_sizes_with_torchs_sympy_functions_print_as_python():
    # On the H100, GPT-2 with dynamic=True failed with "name 'Mod' is not defined": an ATen
    # kernel's output padded to a multiple of 8 has size s - Mod(s, 8) + 8, which printed as is.
    import math

    import torch.utils._sympy.functions as F

    from smelt.symbolic import pexpr
    s = sympy.Symbol("s", integer=True, positive=True)
    for expr in [s - F.Mod(s, 8) + 8, sympy.Mod(s, 8), F.PythonMod(s, 3), F.CleanDiv(8 * s, 8),
                 F.FloorDiv(s + 7, 8), F.CeilDiv(s, 8), F.PowByNatural(s, 2), sympy.Max(s, 4), sympy.Min(s, 4)]:
        for value in (1, 7, 8, 13):
            assert eval(pexpr(expr), {"s": value, "math": math}) == int(expr.subs(s, value)), (expr, pexpr(expr))


def test_an_unknown_function_in_a_size_is_an_error_naming_it():
    import torch.utils._sympy.functions as F

    from smelt.symbolic import pexpr
    with pytest.raises(NotImplementedError, match="BitwiseFn_bitwise_and"):
        pexpr(F.BitwiseFn_bitwise_and(sympy.Symbol("s", integer=True, positive=True), 3))


def test_surely_below_bounds_index_expressions_by_their_vars_ranges():
    x, r = index_var("xindex"), index_var("rindex")
    ranges = {x: 59904, r: 256}
    per_channel = ModularIndexing(x, 1, 144)
    assert surely_below(per_channel, ranges, 144)
    assert not surely_below(per_channel, ranges, 143)
    # A split's chunk runs past the tensor's end in its last chunk: not in bounds without its mask.
    chunked = 144 * r + 36864 * FloorDiv(x, 4608) + per_channel + 451584 * ModularIndexing(x, 144, 32)
    assert not surely_below(chunked, ranges, 32 * 3136 * 144)
    assert surely_below(chunked, ranges, 144 * 255 + 36864 * 12 + 143 + 451584 * 31 + 1)
    # A pad's or a cat piece's shifted index may be negative; a symbol is not bounded.
    assert not surely_below(x - 1, {x: 8}, 8)
    assert not surely_below(x + sympy.Symbol("s0", positive=True, integer=True), {x: 8}, 10 ** 9)
    assert not surely_below(ModularIndexing(x - 3, 1, 4), {x: 8}, 4)  # C's % of a negative base
    assert surely_below(x * r, ranges, 59903 * 255 + 1) and not surely_below(-2 * x, {x: 8}, 8)
