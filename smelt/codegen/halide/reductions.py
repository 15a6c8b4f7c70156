"""Reductions printed in Halide: a Func over x, its pure definition the identity, its update a
walk over `rdom` (the row, in order) reading the reduction's input Func at (rdom.x, x).

Walking each row in order makes "first index wins" (argmax, argmin) a strict comparison, and a
NaN anywhere in a row reaches max/min/argmax as in eager.
"""
from __future__ import annotations

import torch

from ...ir.reduction_kinds import reduction_identity
from ...symbolic import static_int
from ..common import CSEVar, register_dtype
from .handler import PURE_VARS
from .ops import UnsupportedInHalide, func_call, halide_type, literal

NEW = "hl.Expr({name}_input[rdom.x, x])"


def emit_reduction(k, name: str, rtype: str, value) -> tuple[CSEVar, ...]:
    """Prints the reduction of `value` named `name`; returns its results as calls at x."""
    if rtype == "welford_combine":
        return _welford_combine(k, name, value)
    if isinstance(value, tuple):
        raise UnsupportedInHalide(f"smelt: reduction {rtype} of {len(value)} values in Halide")
    dtype = register_dtype(value.dtype)
    k.as_func(f"{name}_input", value, 2)
    new = NEW.format(name=name)
    if rtype in ("sum", "prod", "max", "min", "any", "all"):
        result_dtype = torch.bool if rtype in ("any", "all") else dtype
        return (CSEVar(_fold(k, name, rtype, value.dtype, new), result_dtype, 1),)
    if rtype in ("argmax", "argmin"):
        return _arg_extreme(k, name, rtype, value.dtype, new)
    if rtype == "welford_reduce" and k.schedule.lanes is not None and (static_int(k.plan.rnumel) or 0) > 0:
        # Static, non-empty rows only: the shift reads a row's head, which an empty row lacks.
        return _welford_one_walk(k, name, dtype, new)
    if rtype == "welford_reduce":
        # Two passes over the row, the exact formula: the mean first, then the squares around it.
        # Static, non-empty rows are shifted by their first value (0 where not finite), as eager's
        # Welford starts from it: a row of equal values then has m2 exactly 0.
        kind, zero = halide_type(dtype), literal(0.0, dtype)
        shift = ""
        if (static_int(k.plan.rnumel) or 0) > 0:
            k.body.writeline(f"{name}_first = {new.replace('rdom.x', '0')}")
            k.body.writeline(f'{name}_shift = hl.Func("{name}_shift")')
            k.body.writeline(f"{name}_shift[x] = hl.select(hl.is_finite({name}_first), {name}_first, {zero})")
            k.schedule.reduction(f"{name}_shift", has_update=False)
            shift = f"hl.Expr({name}_shift[x])"
        # Rows shifted by their first value sum to about n times it: in float32 a column of 4096
        # left the mean 8e-5 off (eager: 1e-9), so that sum and the mean are computed in float64.
        wide = bool(shift) and dtype == torch.float32 and k.schedule.device == "cpu" and k.schedule.lanes is None
        total = _fold(k, f"{name}_sum", "sum", dtype, f"({new}) - {shift}" if shift else new, wide=wide)
        k.body.writeline(f'{name}_mean = hl.Func("{name}_mean")')
        if wide:
            f64 = "hl.Float(64)"
            k.body.writeline(f"{name}_mean[x] = hl.cast({kind}, hl.cast({f64}, {shift}) + "
                             f"hl.Expr({name}_sum_wide[x]) / hl.cast({f64}, rnumel))")
        else:
            k.body.writeline(f"{name}_mean[x] = {shift + ' + ' if shift else ''}{total} / hl.cast({kind}, rnumel)")
        centered = k.as_func(f"{name}_centered", CSEVar(f"{new.replace('rdom.x', 'r')} - {name}_mean[x]", dtype, 2), 2)
        square = CSEVar(f"{centered} * {centered}", dtype, 2)
        k.as_func(f"{name}_square", square, 2)
        m2 = _fold(k, f"{name}_m2", "sum", dtype, func_call(f"{name}_square[rdom.x, x]"))
        count = CSEVar(f"hl.cast({halide_type(dtype)}, rnumel)", dtype, 0)
        return CSEVar(func_call(f"{name}_mean[x]"), dtype, 1), CSEVar(m2, dtype, 1), count
    if rtype == "online_softmax_reduce":
        # Two passes: the row's max, then the sum of exp(v - max) (NaN for a row of -inf, as eager).
        # exp(v - max) goes through the kernel's CSE, then is redirected to a Func: a softmax's
        # output, which asks for the same expression, reads the stored value instead of computing
        # a second exp per element.
        row_max = _fold(k, f"{name}_max", "max", dtype, new)
        ops = k.ops()
        shifted = ops.sub(ops.to_dtype(value, dtype), CSEVar(row_max, dtype, 1))
        if dtype == torch.float32:
            # v - max is never positive (or is nan): exp_float32 without its overflow guards, the
            # same bits as any kernel's exp of the value, and what a later ops.exp of it finds.
            terms = k.emit(f"exp_float32({shifted}, {PURE_VARS[shifted.rank]}, nonpositive=True)", dtype, shifted.rank)
            k.cse.remember(ops.unary_text("exp", shifted), terms)
        else:
            terms = ops.exp(shifted)
        stored = k.as_func(f"{name}_exp", terms, 2)
        if terms.rank == 2:
            # Not where the row is one element (a softmax over one key): v - max does not depend
            # on r then, and a member over x alone that asks for its exp could not call a Func at r.
            k.cse.redirect(terms, stored)
        k.schedule.row_values(f"{name}_exp")
        row_sum = _fold(k, f"{name}_sum", "sum", dtype, func_call(f"{name}_exp[rdom.x, x]"))
        return CSEVar(row_max, dtype, 1), CSEVar(row_sum, dtype, 1)
    raise UnsupportedInHalide(f"smelt: reduction {rtype} has no Halide form")


# Values of a row's head whose mean shifts the row in the one-walk mean and m2 (one AVX-512 vector).
SHIFT_HEAD = 16


def _welford_one_walk(k, name: str, dtype: torch.dtype, new: str) -> tuple[CSEVar, ...]:
    """Mean and m2 of contiguous rows in one walk: S1 and S2, the sums of d and d*d for
    d = v - s, in lane partials, then mean = s + S1/n and m2 = S2 - S1^2/n.

    s is the mean of the row's first SHIFT_HEAD values (0 if not finite, so an inf still makes
    the mean inf): (mean - s)^2 <= m2 / SHIFT_HEAD, which bounds the cancellation in m2 to a few
    ulps per element, as accurate as the two-pass form and eager on N(0, 1) and offset rows
    (benchmarks/probes/norm_accuracy.py, layer_norm 2048x2048: max error 2.0e-6 against eager's 1.9e-6;
    1.5e-5 against 4.8e-5 with an offset of 100). One walk, not two: layer_norm's kernel over 2048x2048 (benchmarks/probes/halide_ab.py)
    2.05 -> 1.81 ms with one thread, 1.03 -> 0.97 ms with two.
    """
    lanes, kind, zero = k.schedule.lanes, halide_type(dtype), literal(0.0, dtype)
    head = new.replace("rdom.x", "hl.min(lane, rnumel - 1)")
    first = new.replace("rdom.x", "0")
    value = new.replace("rdom.x", f"hl.min({name}_element, rnumel - 1)")
    lines = [
        # The head's mean as first + mean(head - first): exactly the value of a row of equal values,
        # whose m2 is then exactly 0, as in eager's Welford (std's gradient there is 0, not 0.4).
        f"{name}_first = {first}",
        f"{name}_head = {name}_first + fold_lanes(lambda a, b: a + b, [hl.select(lane < rnumel, {head} - "
        f"{name}_first, {zero}) for lane in range({SHIFT_HEAD})]) / hl.cast({kind}, hl.min(rnumel, {SHIFT_HEAD}))",
        f'{name}_shift = hl.Func("{name}_shift")',
        f"{name}_shift[x] = hl.select(hl.is_finite({name}_head), {name}_head, {zero})",
    ]
    for line in lines:
        k.body.writeline(line)
    blocked = _block_elements(k, "sum", dtype)
    at = ""  # the lanes' block index, where the row is folded block by block
    if blocked:
        b, element, blocks = _block_domain(k, name)
        at = f"{b}, "
    else:
        k.body.writeline(f'{name}_chunks = hl.RDom([(0, (rnumel + {lanes - 1}) // {lanes})], "{name}_chunks")')
        k.body.writeline(f"{name}_element = {name}_chunks.x * {lanes} + r")
    lanes_at = f"{name}_lanes[r, {at}x]"
    lines = [
        f"{name}_d = hl.select({name}_element < rnumel, {value} - hl.Expr({name}_shift[x]), {zero})",
        f'{name}_lanes = hl.Func("{name}_lanes")',
        f"{lanes_at} = ({zero}, {zero})",
        f"{lanes_at} = ({lanes_at}[0] + {name}_d, {lanes_at}[1] + {name}_d * {name}_d)",
    ]
    folds = [f"fold_lanes(lambda a, b: a + b, [hl.Expr({name}_lanes[lane, {at}x][{i}]) for lane in range({lanes})])"
             for i in (0, 1)]
    if blocked:
        lines += [
            f'{name}_block = hl.Func("{name}_block")',
            f"{name}_block[{b}, x] = ({folds[0]}, {folds[1]})",
            # The blocks' sums in float64 (each element of the Tuple reads only its own old
            # value): S1 of a row shifted by its head's mean is about n times their distance,
            # and in float32 it left the mean of 32M values 1e-7 off (eager: 1e-11).
            f'{name}_sums = hl.Func("{name}_sums")',
            f"{name}_sums[x] = (hl.f64(0.0), hl.f64(0.0))",
            f"{name}_sums[x] = ({name}_sums[x][0] + hl.cast(hl.Float(64), {name}_block[{blocks}.x, x][0]), "
            f"{name}_sums[x][1] + hl.cast(hl.Float(64), {name}_block[{blocks}.x, x][1]))",
            f"{name}_s1 = hl.Expr({name}_sums[x][0])",
            f"{name}_s2 = hl.Expr({name}_sums[x][1])",
            f"{name}_n = hl.cast(hl.Float(64), rnumel)",
            f'{name}_stats = hl.Func("{name}_stats")',
            f"{name}_stats[x] = (hl.cast({kind}, hl.cast(hl.Float(64), {name}_shift[x]) + {name}_s1 / {name}_n), "
            f"hl.cast({kind}, {name}_s2 - {name}_s1 * {name}_s1 / {name}_n))",
        ]
    else:
        lines += [
            f"{name}_s1 = {folds[0]}",
            f"{name}_s2 = {folds[1]}",
            f'{name}_stats = hl.Func("{name}_stats")',
            f"{name}_stats[x] = (hl.Expr({name}_shift[x]) + {name}_s1 / hl.cast({kind}, rnumel), "
            f"{name}_s2 - {name}_s1 * {name}_s1 / hl.cast({kind}, rnumel))",
        ]
    lines += [
        f'{name}_mean = hl.Func("{name}_mean")',
        f"{name}_mean[x] = {name}_stats[x][0]",
        f'{name}_m2 = hl.Func("{name}_m2")',
        f"{name}_m2[x] = {name}_stats[x][1]",
    ]
    for line in lines:
        k.body.writeline(line)
    if blocked:
        k.schedule.block_partials(f"{name}_lanes", f"{name}_block", b, f"{name}_sums", f"{blocks}.x")
        k.schedule.reduction(f"{name}_sums")
    else:
        k.schedule.lane_partials(f"{name}_lanes", f"{name}_stats")
    k.schedule.reduction(f"{name}_shift", has_update=False)
    k.schedule.reduction(f"{name}_stats", has_update=False)
    count = CSEVar(f"hl.cast({kind}, rnumel)", dtype, 0)
    return CSEVar(func_call(f"{name}_mean[x]"), dtype, 1), CSEVar(func_call(f"{name}_m2[x]"), dtype, 1), count


def _combine(rtype: str, reg: torch.dtype, acc: str, new: str) -> tuple[str, object]:
    """(text of rtype's update of acc by new, the identity) for a fold over values of type reg."""
    fill = reduction_identity(rtype, reg)
    if rtype == "sum":
        return f"{acc} + {new}", fill
    if rtype == "prod":
        return f"{acc} * {new}", fill
    if rtype in ("any", "all") or (rtype in ("max", "min") and reg == torch.bool):
        op = "|" if rtype in ("any", "max") else "&"
        truth = new if reg == torch.bool else f"({new} != {literal(0, reg)})"
        return f"{acc} {op} {truth}", rtype in ("all", "min")
    if reg.is_floating_point:
        pick = ">" if rtype == "max" else "<"
        return f"hl.select(hl.is_nan({new}) | ({new} {pick} {acc}), {new}, {acc})", fill
    return f"hl.{rtype}({acc}, {new})", fill


def _fold(k, name: str, rtype: str, dtype: torch.dtype, new: str, wide: bool = False) -> str:
    """name[x] = rtype over the row of `new` (read at rdom.x); returns the call name[x].

    When rows lie contiguous in memory, each row is first folded into LANES partial results,
    lane l taking elements l, l + LANES, ...: the loop over a row then loads whole vectors. The
    lanes are then combined pairwise in one expression (fold_lanes): a fold over them one by one
    waits on each step's result, and cost as much as the row's whole vector loop. `wide`: a
    float32 sum over a strided row is added up in float64 whatever its length.
    """
    reg = register_dtype(dtype)
    fill_type = torch.bool if rtype in ("any", "all") or reg == torch.bool else reg
    acc = func_call(f"{name}[x]")
    update, fill = _combine(rtype, reg, acc, new)
    k.body.writeline(f'{name} = hl.Func("{name}")')
    if k.schedule.lanes is not None and _block_elements(k, rtype, reg):
        return _fold_blocks(k, name, rtype, reg, fill_type, fill, new)
    if k.schedule.lanes is not None:
        lanes = k.schedule.lanes
        lane_acc = func_call(f"{name}_lanes[r, x]")
        element = f"{name}_chunks.x * {lanes} + r"
        k.body.writeline(f'{name}_chunks = hl.RDom([(0, (rnumel + {lanes - 1}) // {lanes})], "{name}_chunks")')
        k.body.writeline(f"{name}_element = {element}")
        lane_new = new.replace("rdom.x", f"hl.min({name}_element, rnumel - 1)")
        lane_new = f"hl.select({name}_element < rnumel, {lane_new}, {literal(fill, fill_type)})"
        lane_update, _ = _combine(rtype, reg, lane_acc, lane_new)
        k.body.writeline(f'{name}_lanes = hl.Func("{name}_lanes")')
        k.body.writeline(f"{name}_lanes[r, x] = {literal(fill, fill_type)}")
        k.body.writeline(f"{name}_lanes[r, x] = {lane_update}")
        pair, _ = _combine(rtype, reg, "a", "b")
        k.body.writeline(f"{name}[x] = fold_lanes(lambda a, b: {pair}, "
                         f"[{func_call(f'{name}_lanes[lane, x]')} for lane in range({lanes})])")
        k.schedule.lane_partials(f"{name}_lanes", name)
        k.schedule.reduction(name, has_update=False)
        return acc
    if reg == torch.float32 and rtype == "sum" and k.schedule.device == "cpu" and (wide or _block_elements(k, rtype, reg)):
        return _fold_column_wide(k, name, new)
    k.body.writeline(f"{name}[x] = {literal(fill, fill_type)}")
    k.body.writeline(f"{name}[x] = {update}")
    k.schedule.reduction(name)
    return acc


# A lane of a long row adds at most this many of the row's elements before its partial is set
# aside with the block's: one lane per 64 elements of a whole row left var_mean of 26M float32
# values (400k values a lane) off by 1.3e-4, where eager's error is 4e-8. Blocks are then added
# in turn (a few hundred in a row of 26M).
CHUNKS_PER_BLOCK = 512
# A strided row (a column reduction: no lanes) longer than this, or of unknown length, adds up
# a float32 sum in float64 (_fold_column_wide).
COLUMN_BLOCK = 4096


def _block_elements(k, rtype: str, reg: torch.dtype) -> int | None:
    """Elements a block of a row's float sum takes, where the row is folded block by block (a
    row longer than a block, or of unknown length, on the CPU); None: one walk over the row."""
    if k.schedule.device != "cpu" or rtype != "sum" or not reg.is_floating_point:
        return None  # max, min and integer sums are exact in any order
    block = k.schedule.lanes * CHUNKS_PER_BLOCK if k.schedule.lanes is not None else COLUMN_BLOCK
    rnumel = static_int(k.plan.rnumel)
    return block if rnumel is None or rnumel > block else None


def _fold_column_wide(k, name: str, new: str) -> str:
    """name[x] = the float32 sum of a long strided row (a column), added up in float64: a vector of
    neighbouring columns walks down the rows, so a row is not cut into lanes. var(0) over 2M rows
    of 2 columns was 1.3e-3 off in float32, as exact as eager (1e-8) in float64; a block-by-block
    float32 sum reached 4e-7 but ran 4x slower. The cost: 1.4x on a 65536x1000 column sum of
    unknown length (2-core CPU, 20.8 -> 28.8 ms), where the rows were short enough for speed."""
    for line in (f'{name}_wide = hl.Func("{name}_wide")',
                 f"{name}_wide[x] = hl.f64(0.0)",
                 f"{name}_wide[x] = hl.Expr({name}_wide[x]) + hl.cast(hl.Float(64), {new})",
                 f"{name}[x] = hl.cast(hl.Float(32), hl.Expr({name}_wide[x]))"):
        k.body.writeline(line)
    k.schedule.reduction(f"{name}_wide")
    k.schedule.reduction(name, has_update=False)
    return func_call(f"{name}[x]")


def _block_domain(k, name: str) -> tuple[str, str, str]:
    """Declares a block Var, a Func's chunks within a block and the blocks of the row; returns
    (block var, element index of lane r's chunk, the blocks' RDom)."""
    lanes, block = k.schedule.lanes, k.schedule.lanes * CHUNKS_PER_BLOCK
    b = f"{name}_b"
    k.body.writeline(f'{b} = hl.Var("{b}")')
    k.body.writeline(f'{name}_chunks = hl.RDom([(0, {CHUNKS_PER_BLOCK})], "{name}_chunks")')
    k.body.writeline(f"{name}_element = ({b} * {CHUNKS_PER_BLOCK} + {name}_chunks.x) * {lanes} + r")
    k.body.writeline(f'{name}_blocks = hl.RDom([(0, (rnumel + {block - 1}) // {block})], "{name}_blocks")')
    return b, f"{name}_element", f"{name}_blocks"


def _fold_blocks(k, name: str, rtype: str, reg: torch.dtype, fill_type, fill, new: str) -> str:
    """name[x] = the row's sum, lane partials of each block folded, then the blocks added."""
    lanes = k.schedule.lanes
    b, element, blocks = _block_domain(k, name)
    lane_new = new.replace("rdom.x", f"hl.min({element}, rnumel - 1)")
    lane_new = f"hl.select({element} < rnumel, {lane_new}, {literal(fill, fill_type)})"
    lane_update, _ = _combine(rtype, reg, func_call(f"{name}_lanes[r, {b}, x]"), lane_new)
    pair, _ = _combine(rtype, reg, "a", "b")
    for line in (f'{name}_lanes = hl.Func("{name}_lanes")',
                 f"{name}_lanes[r, {b}, x] = {literal(fill, fill_type)}",
                 f"{name}_lanes[r, {b}, x] = {lane_update}",
                 f'{name}_block = hl.Func("{name}_block")',
                 f"{name}_block[{b}, x] = fold_lanes(lambda a, b: {pair}, "
                 f"[{func_call(f'{name}_lanes[lane, {b}, x]')} for lane in range({lanes})])",
                 # The blocks' sums in float64: one addition per block, and the total may be
                 # large beside what it is later combined with (a shifted row's sum).
                 f'{name}_total = hl.Func("{name}_total")',
                 f"{name}_total[x] = hl.f64(0.0)",
                 f"{name}_total[x] = hl.Expr({name}_total[x]) + hl.cast(hl.Float(64), {name}_block[{blocks}.x, x])",
                 f"{name}[x] = hl.cast({halide_type(reg)}, hl.Expr({name}_total[x]))"):
        k.body.writeline(line)
    k.schedule.block_partials(f"{name}_lanes", f"{name}_block", b, f"{name}_total", f"{blocks}.x")
    k.schedule.reduction(f"{name}_total")
    k.schedule.reduction(name, has_update=False)
    return func_call(f"{name}[x]")


def _arg_extreme(k, name: str, rtype: str, dtype: torch.dtype, new: str) -> tuple[CSEVar]:
    """The first index of the row's extreme value (a NaN counts as the extreme, as in eager): the
    extreme in one pass, then the least index holding it in another. Two plain folds rather than
    one over (value, index) Tuples, which Halide 21 updates in the wrong order under strict_float."""
    reg = register_dtype(dtype)
    if reg == torch.bool:
        new = f"hl.cast(hl.UInt(8), {new})"
        reg = torch.uint8
    best = _fold(k, f"{name}_best", "max" if rtype == "argmax" else "min", reg, new)
    holds = f"({new} == {best})"
    if reg.is_floating_point:
        holds = f"({holds} | (hl.is_nan({new}) & hl.is_nan({best})))"
    none = torch.iinfo(torch.int64).max
    first = _fold(k, f"{name}_first", "min", torch.int64,
                  f"hl.select({holds}, hl.cast(hl.Int(64), rdom.x), {literal(none, torch.int64)})")
    # An empty row (or one the extreme never matches) answers 0, as the Triton kernels do.
    k.body.writeline(f'{name} = hl.Func("{name}")')
    k.body.writeline(f"{name}[x] = hl.select({first} == {literal(none, torch.int64)}, hl.i64(0), {first})")
    return (CSEVar(func_call(f"{name}[x]"), torch.int64, 1),)


def _welford_combine(k, name: str, value: tuple) -> tuple[CSEVar, ...]:
    """Merges partial (mean, m2, count) triples exactly, in passes: the total count, the mean
    weighted by the counts, then each partial's m2 plus its count times its squared distance to
    that mean. (A one-pass merge over Tuples is what Halide 21 updates in the wrong order under
    strict_float: an element read the count its own update had already replaced.)"""
    dtype = register_dtype(value[0].dtype)
    parts = [k.as_func(f"{name}_{part}_input", v, 2) for part, v in zip(("mean", "m2", "count"), value)]
    at = [p.name.replace("[r, x]", "[rdom.x, x]") for p in parts]
    count = _fold(k, f"{name}_count", "sum", dtype, at[2])
    total = _fold(k, f"{name}_weighted", "sum", dtype, f"{at[2]} * {at[0]}")
    k.body.writeline(f'{name}_mean = hl.Func("{name}_mean")')
    k.body.writeline(f"{name}_mean[x] = hl.select({count} > 0, {total} / {count}, {literal(0, dtype)})")
    mean = func_call(f"{name}_mean[x]")
    spread = f"{at[1]} + {at[2]} * ({at[0]} - {mean}) * ({at[0]} - {mean})"
    m2 = _fold(k, f"{name}_m2", "sum", dtype, spread)
    return CSEVar(mean, dtype, 1), CSEVar(m2, dtype, 1), CSEVar(count, dtype, 1)
