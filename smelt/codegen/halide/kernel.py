"""Prints a KernelPlan as a Halide pipeline, written against Halide's Python API.

The pipeline computes over the plan's iteration space with pure vars `x` (an output) and `r` (an
element of its row). Each member's value becomes a Func: `buf3[x]` for one value per x, `buf3[r, x]`
for one per (x, r). A reduction is a Func over x whose update walks an RDom over r, reading its
input Func at (rdom, x). Values pass between members as Func calls, never through memory, so the
plan's phases need no loops of their own: Halide orders the Funcs by their dependencies.

Buffers are flat, one dimension over their storage from the tensor's first element, and indexed
with smelt's index expressions, as a Triton kernel indexes its pointers. An output is a Func with
no pure definition and one update over the domain of the member it stores: out[index(x, r)] = value.

The module printed holds constants naming the launch arguments and a function named after the
kernel, which returns the pipeline (algorithm, then schedule) and its arguments;
smelt.runtime.halide_compile compiles it.
"""
from __future__ import annotations

import dataclasses
import re

import sympy
import torch

from ...ir.ops import is_indirect
from ...scheduler.kernel_plan import KernelPlan, kernel_sizes_symbols
from ...scheduler.nodes import RINDEX, XINDEX
from ...scheduler.placement import ROW_VALUED, Placement
from ...scheduler.tiling import stride_along
from ...symbolic import index_bounds, simplify_index, sizes_in_value_math
from ..common import CSE, CSEVar, IndentedBuffer, register_dtype
from ..kernel_body import PrintedKernel
from . import random
from .division import DIVISION_HELPERS
from .handler import ConstantVar, HalideOps
from .ops import HalideIndexPrinter, UnsupportedInHalide, func_call, halide_type
from .pieces import Piece, decide, split
from .reductions import emit_reduction
from .scan import emit_scan
from .schedule import ROW_DOMAIN, ROW_DOMAIN_DECLARATION, HalideSchedule, periods_along
from .special import SPECIAL_FUNCTIONS


# A kernel built with Halide's asserts (its ASSERTS line: on CUDA, or one that checks a gathered index
# on the CPU; halide_compile.target_for reads it) loads through a promise: every index of its domain
# is in bounds by construction, and the promise spares bounds inference, whose regions those asserts
# check, an over-estimate through // and %. Without asserts the regions are checked by nothing, and the load is
# plain: Halide 21's skip-stages pass fails on a promise inside a select's condition ("argument of Not
# is not a bool", a masked_fill's mask beside a sum read in one branch: fuzz seeds 4360 and earlier).
LOAD_PROMISED = '''

def load(buffer, index):
    # In bounds by construction: the promise keeps bounds inference from over-estimating // and %.
    return buffer[hl.unsafe_promise_clamped(index, 0, buffer.dim(0).extent() - 1)]
'''
LOAD_PLAIN = '''

def load(buffer, index):
    # In bounds by construction (the kernel is built without asserts, so nothing checks its regions).
    return buffer[index]
'''

# Halide's simplifier folds cast(f16, cast(f32, b)) of a bfloat16 b into one conversion, which makes
# every NaN inf (fuzz seed 4361: a bfloat16 mean of nothing summed to float16). The xor keeps the
# float32 step; float64 values are converted as they are.
# Halide rounds float32 to bfloat16 on the integer bits (adding 0x7FFF and the kept lowest bit), which
# turns a NaN whose payload lies only in the dropped bits into inf, and carries one whose top bits are
# all ones (0x7FFFFFFF) into -0.0 or +0.0: eager gives NaN. to_bfloat16 makes a NaN the default one
# first (on the bits: hl.is_nan rewrites a deep argument as a tree). A value whose NaN can only be
# one of those a bfloat16 holds exactly rounds without it (HalideKernel.rounds_unguarded): a guard
# on every rounding of a chain of bfloat16 ops cost it 40%.
CONVERSION_HELPERS = {"to_float16": '''

def to_float16(value):
    if value.type() == hl.Float(32):
        value = hl.reinterpret(hl.Float(32), hl.reinterpret(hl.UInt(32), value) ^ hl.u32(0))
    return hl.cast(hl.Float(16), value)
''', "to_bfloat16": '''

def to_bfloat16(value):
    bits = hl.reinterpret(hl.UInt(32), hl.cast(hl.Float(32), value))
    nan = (bits & hl.u32(0x7FFFFFFF)) > hl.u32(0x7F800000)
    default = (bits & hl.u32(0x80000000)) | hl.u32(0x7FC00000)
    return hl.cast(hl.BFloat(16), hl.reinterpret(hl.Float(32), hl.select(nan, default, bits)))
'''}

MODULE_HELPERS = '''

def load_clamped(buffer, index):
    # A masked or indirect load: a lane whose index lies outside is discarded, but must not fault.
    return buffer[hl.clamp(index, 0, buffer.dim(0).extent() - 1)]


def fold_lanes(combine, values):
    # Pairwise, each lane with the one half the list away: each level's combines are independent
    # (they overlap), and lane i meets lane i + half as whole vectors do, which LLVM turns into
    # vector ops (neighbours paired were 64 scalar steps: rms_norm 2048x2048 1.45 -> 1.23 ms).
    while len(values) > 1:
        half = len(values) // 2
        values = [combine(values[i], values[i + half]) for i in range(half)] + values[2 * half:]
    return values[0]


def in_output(out, index):
    return hl.unsafe_promise_clamped(index, 0, out.output_buffer().dim(0).extent() - 1)


# Halide's exp and log are polynomials that miss IEEE's special values (exp(nan) = 0,
# log(inf) = 88.7) and break far out: exp's integer exponent overflows from about 1e10
# (exp(1e10) = 0), log reads a subnormal's exponent field as if it were normal (log(1e-45) =
# -88). Arguments are clamped where the result no longer changes,
# subnormals scaled into the normal range, and the special values put back.
def exp(v):
    low, high = (-746.0, 710.0) if v.type() == hl.Float(64) else (-104.0, 89.0)  # exp(high) = inf
    clamped = hl.clamp(v, hl.cast(v.type(), low), hl.cast(v.type(), high))
    return hl.select(hl.is_nan(v), v, hl.exp(clamped))


def log(v):
    wide = v.type() == hl.Float(64)
    smallest_normal, scale, bits = (2.0 ** -1022, 2.0 ** 54, 54) if wide else (2.0 ** -126, 2.0 ** 24, 24)
    subnormal = (v > 0) & (v < hl.cast(v.type(), hl.f64(smallest_normal)))  # f64: 2**-1022 is 0 as f32
    scaled = hl.select(subnormal, v * hl.cast(v.type(), hl.f64(scale)), v)
    shift = hl.select(subnormal, hl.cast(v.type(), hl.f64(bits * 0.6931471805599453)), hl.cast(v.type(), 0))
    return hl.select(hl.is_nan(v) | (hl.is_inf(v) & (v > 0)), v, hl.log(scaled) - shift)

'''


@dataclasses.dataclass
class HalideKernelSource:
    """A generated pipeline and what the wrapper needs to launch it."""

    name: str
    source: str
    params: list[tuple[str, str]]  # (parameter, buffer name): inputs, then outputs
    size_args: list[str]  # size symbols, bound by name in the wrapper
    xnumel: sympy.Expr
    rnumel: sympy.Expr | None
    origins: list[str]


# Temporaries in a row before one is held in a Func (see HalideKernel.emit): the fuzzer's chain was 31.
MAX_EXPR_DEPTH = 12
# The size a value would have as a tree (each read of a temporary counting its whole tree) past
# which it is held in a Func: fuzz #22's chain and a softplus through floor division (below) both
# passed 10**6.
MAX_TREE_SIZE = 4096
# How many times a math helper's body reads its argument, as a tree: float_fmod reduces its
# remainder in 11 steps that each read the last one twice; the others read theirs a few times
# (is_nan, clamps, selects). Other calls (load, hl.*) read it once.
HELPER_READS = {**dict.fromkeys(SPECIAL_FUNCTIONS, 4), **dict.fromkeys(DIVISION_HELPERS, 4),
                "float_fmod": 2 ** 11, "log": 6, "exp": 3, "exp_float32": 12, "to_bfloat16": 2}
_TEMPORARY = re.compile(r"\btmp\d+\b")
# A name in a printed expression (not an attribute: hl.sqrt's sqrt), and whether it is called.
_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*(\()?")
_INPUT = re.compile(r"in_ptr\d+")
# Calls whose value depends on their arguments alone: loads and the math helpers (not the random
# numbers' helpers, whose words are a per-element name anyway).
_X_FREE_CALLS = frozenset({"load", "load_clamped", *HELPER_READS})
_HELPER_CALL = re.compile(r"(?<![\w.])([a-z_][a-z0-9_]*)\(")


_ASSIGNED_TEMPORARY = re.compile(r"^\s*(tmp\d+) = ")


def _without_unused_temporaries(lines: list[str]) -> list[str]:
    """lines less each temporary no later line reads (a piece's decided comparisons and the loads
    of the inputs it never selects)."""
    kept, read = [], set()
    for line in reversed(lines):
        assigned = _ASSIGNED_TEMPORARY.match(line)
        if assigned and assigned.group(1) not in read:
            continue
        read.update(_TEMPORARY.findall(line[assigned.end():] if assigned else line))
        kept.append(line)
    return kept[::-1]


def halide_kernel_name(plan: KernelPlan, index: int) -> str:
    kind = "red" if plan.is_reduction else "poi"
    if plan.has_scan:
        kind = "scan"
    # "aten._softmax.default" -> "softmax"
    ops = sorted({o.split(".")[1].strip("_") if o.count(".") >= 1 else o for n in plan.nodes for o in n.buffer.origins})
    ops = [o for o in ops if o][:5]
    return f"halide_{kind}_fused_{'_'.join(ops) or 'copy'}_{index}"


class HalideKernel(PrintedKernel):
    """Generates one pipeline by running each member's loop body under HalideOps."""

    def __init__(self, plan: KernelPlan, graph, schedule_class=HalideSchedule, plain=False,
                 pieces: list[Piece] | None = None):
        super().__init__(plan, graph)
        # A pointwise kernel printed a loop per piece of its domain (pieces.py): each piece's
        # members and stores are printed again, under `piece`, over the piece's own (r, x).
        self.pieces = pieces
        self.piece: Piece | None = None
        self.cuts: list[tuple[str, sympy.Expr]] = []  # comparisons of index values: where pieces could start
        self.piece_updates: dict[str, int] = {}  # output Func -> updates printed (one a piece)
        # The plain form, for a kernel Halide's compiler refused once: values the same for every x stay
        # inline, and per-row outputs keep loops of their own.
        self.per_column_funcs = not plain
        self.inputs: dict[str, str] = {}  # buffer -> ImageParam name
        self.outputs: dict[str, str] = {}  # buffer -> output Func name
        self.sizes: list[str] = []
        self.scan_results: dict[tuple, tuple[CSEVar, ...]] = {}
        self.in_place: list = []  # (node, value, per (x, r)) of stores into buffers the kernel reads
        self.indirect: dict[str, str] = {}  # indirect symbol -> how its bound is checked
        self.indirect_rank: dict[str, int] = {}  # indirect symbol -> the rank of the value it was made of
        self.schedule = schedule_class(plan)  # halide_schedule (CPU) or halide_gpu_schedule
        self.schedule.rows_join_elements = not plain
        self.uses_random = False  # set by the random ops: the module then defines philox()
        # Set while printing an update definition over an RDom (a serial scan's combine): helpers then
        # define no Func of their own over (r, x), which Halide refuses to reference an RDom.
        self.in_update = False
        self.depth: dict[str, int] = {}  # a temporary's depth in temporaries since a Func boundary
        self.tree_size: dict[str, int] = {}  # its size as a tree since a Func boundary (see emit)
        self.temporaries: dict[str, CSEVar] = {}  # by name
        # Temporaries whose value is the same for every x (a function of r and the sizes alone).
        self.same_for_every_x: set[str] = set()
        self.per_column_calls: dict[str, str] = {}  # such a temporary -> its Func's call, once held in one
        self.tiles = None  # a reordered store's TransposeTiles or RowChunks (schedule.py), set by generate_body
        self.row_domain = "x_dom"  # the RDom per-row outputs walk (schedule.py ROW_DOMAIN), set by generate_body
        self.tile_loads: dict[str, CSEVar] = {}  # load text -> its register tile, read at (r, x)
        # Halide 21's CUDA code generator crashes on bfloat16 casts: GPU kernels hold bfloat16 as its
        # 16 bits and convert with integer math (halide_gpu_schedule.BF16_HELPERS).
        self.bf16_bits = self.schedule.bf16_as_bits
        # Float values computed from values a bfloat16 holds exactly by ops that keep a NaN's payload or
        # make the default one (handler.QUIETING_BINARY / _UNARY): rounded to bfloat16 unguarded.
        self.quiet_values: set[str] = set()

    def ops(self) -> HalideOps:
        return HalideOps(self)

    # ------------------------------------------------------------ half floats

    def storage_type(self, dtype: torch.dtype) -> str:
        """The Halide type of a buffer of dtype."""
        return "hl.UInt(16)" if self.bf16_bits and dtype == torch.bfloat16 else halide_type(dtype)

    def widen(self, text: str, dtype: torch.dtype) -> str:
        """A value of dtype, as stored, in its register type."""
        if self.bf16_bits and dtype == torch.bfloat16:
            return f"bf16_bits_to_f32({text})"
        return f"hl.cast({halide_type(register_dtype(dtype))}, {text})"

    def rounds_unguarded(self, value: CSEVar) -> bool:
        """Whether value keeps a NaN through Halide's bfloat16 rounding: a value typed bfloat16 (held
        exactly in its float32 register, its low 16 bits zero), a literal, a value no float, or one
        computed from such values by ops that pass a NaN's payload on or make the default NaN."""
        return (value.dtype == torch.bfloat16 or not value.dtype.is_floating_point
                or value.name in self.quiet_values or isinstance(value, ConstantVar))

    def narrow(self, text: str, dtype: torch.dtype, quiet: bool = False) -> str:
        """A register value as dtype is stored; `quiet`: rounds_unguarded holds for it."""
        if self.bf16_bits and dtype == torch.bfloat16:
            return f"f32_to_bf16_bits(hl.cast(hl.Float(32), {text}))"
        if dtype == torch.float16:
            return f"to_float16({text})"
        if dtype == torch.bfloat16 and not quiet:
            return f"to_bfloat16({text})"
        return f"hl.cast({halide_type(dtype)}, {text})"

    # ------------------------------------------------------------ printing helpers

    def emit(self, expr: str, dtype: torch.dtype, rank: int) -> CSEVar:
        helpers = [HELPER_READS.get(name, 1) for name in _HELPER_CALL.findall(expr)]
        reads_per_use = max(helpers, default=1)
        if reads_per_use > 1 and not self.in_update:
            # A helper that reads its argument many times (float_fmod: 2**11) gets a Func call
            # for a large argument: holding the helper's result instead would keep the copies.
            for name in dict.fromkeys(_TEMPORARY.findall(expr)):
                if name in self.temporaries and reads_per_use * self.tree_size.get(name, 1) > MAX_TREE_SIZE:
                    held = self._hold(self.temporaries[name])
                    expr = re.sub(rf"\b{name}\b", held.name, expr)
        reads = _TEMPORARY.findall(expr)
        x_free = self._same_for_every_x(expr)
        if not x_free:
            expr = self._per_column_values(expr, reads)
            reads = _TEMPORARY.findall(expr)
        var = self.cse.generate(self.body, expr, dtype, rank)
        if var.name in self.depth:  # found by CSE
            return var
        self.temporaries[var.name] = var
        if x_free:
            self.same_for_every_x.add(var.name)
        depth = 1 + max((self.depth.get(name, 0) for name in reads), default=0)
        size = 1 + reads_per_use * sum(self.tree_size.get(name, 1) for name in reads)
        if (depth > MAX_EXPR_DEPTH or size > MAX_TREE_SIZE) and not self.in_update:
            # hl.is_nan and hl.strict_float rewrite their argument as a tree, exponential in the depth of
            # shared subexpressions (a bfloat16 chain of floor division, log and clamp took 22 GB, fuzz
            # #22; a softplus, then floor division's float_fmod, 22 GB in Halide's compile); a Func call
            # is a leaf to them, and Halide inlines the Func again.
            return self._hold(var)
        self.depth[var.name] = depth
        self.tree_size[var.name] = size
        return var

    def _same_for_every_x(self, expr: str) -> bool:
        """Whether expr's value depends on r and the sizes alone. Conservative: every name in it
        must be known to (a random value's words, a Func's call, anything else: no)."""
        for name, call in _NAME.findall(expr):
            if call:
                if name not in _X_FREE_CALLS:
                    return False
            elif not (name in ("r", "hl") or name in self.same_for_every_x or name in self.sizes
                      or _INPUT.fullmatch(name)):
                return False
        return True

    def _per_column_values(self, expr: str, reads: list[str]) -> str:
        """expr with each value it reads that is the same for every x and costs more than a load (a
        batch norm's 1/sqrt(var + eps) over rows of C, in an NHWC kernel) read from a Func over r
        computed once per call, not once per row (MobileNetV3's costliest NHWC batch norm on 2 cores:
        1550 -> 614 us). GPU schedules have no such Func (their kernels are memory-bound)."""
        # (Not inside a piece: its rows are runs, each all of the piece's r.)
        if self.in_update or not self.per_column_funcs or self.piece is not None or not hasattr(self.schedule, "per_column"):
            return expr
        for name in dict.fromkeys(reads):
            var = self.temporaries.get(name)
            if name not in self.per_column_calls:
                if var is None or name not in self.same_for_every_x or var.rank < 2 or self.tree_size.get(name, 1) < 3:
                    continue
                func = self.fresh(f"{name}_per_column")
                self.body.writeline(f'{func} = hl.Func("{func}")')
                self.body.writeline(f"{func}[r] = {name}")
                self.schedule.per_column(func)
                call = CSEVar(func_call(f"{func}[r]"), var.dtype, var.rank)
                self.cse.redirect(var, call)
                self.per_column_calls[name] = call.name
            expr = re.sub(rf"\b{name}\b", self.per_column_calls[name], expr)
        return expr

    def _hold(self, var: CSEVar) -> CSEVar:
        """var's value as a call of a Func holding it; later requests for var's expression get the call."""
        # A var may be a Func's call rather than a temporary (its name then is no identifier).
        stem = var.name if var.name.isidentifier() else "held"
        boundary = self.as_func(self.fresh(f"{stem}_value"), var, var.rank)
        self.cse.redirect(var, boundary)
        self.depth[boundary.name] = 0
        self.tree_size[boundary.name] = 1
        return boundary

    def fresh(self, stem: str) -> str:
        name = f"{stem}{self.cse.counter}"
        self.cse.counter += 1
        return name

    # ------------------------------------------------------------ pieces (pieces.py)

    def _ranges(self) -> dict:
        """The pure vars' extents where index expressions are simplified: the current piece's own."""
        return self.piece.ranges() if self.piece is not None else {XINDEX: self.plan.xnumel, RINDEX: self.plan.rnumel}

    def simplify(self, expr) -> sympy.Expr:
        if self.piece is None:
            return super().simplify(expr)
        return simplify_index(sympy.sympify(expr), self._ranges())

    def member_index(self, node) -> tuple[list, list | None]:
        index, rindex = super().member_index(node)
        if self.piece is None:
            return index, rindex
        change = self.piece.substitution()
        return [self.simplify(sympy.sympify(e).subs(change, simultaneous=True)) for e in index], rindex

    def compare_indices(self, op: str, difference: sympy.Expr) -> bool | None:
        """`difference op 0` where the current piece decides it; outside pieces, None, and the
        comparison is remembered as a cut."""
        if self.piece is None:
            if difference.free_symbols & {XINDEX, RINDEX}:
                self.cuts.append((op, difference))
            return None
        found = index_bounds(difference, self._ranges())
        return None if found is None else decide(op, *found)

    def piecewise(self) -> list[Piece] | None:
        """After the body is printed: the pieces to print it in again, a loop each, where its masked
        loads read by comparisons of one coordinate of x (of r, in a pointwise kernel over (r, x)):
        a cat's pieces. None for other kernels."""
        if (self.schedule.device != "cpu" or not self.per_column_funcs or not self.schedule.gathers
                or self.plan.is_reduction or self.plan.has_scan or self.in_place or self.uses_random
                or self.schedule.scatters or any(n.is_scatter for n in self.plan.nodes)):
            return None
        placement = Placement.XR if self.plan.blocks_2d else Placement.X
        extents = self.static_extents()
        if any(self.plan.placement[n.name] != placement for n in self.plan.nodes) or "xnumel" not in extents:
            return None
        if self.plan.blocks_2d:
            return split(self.cuts, extents["xnumel"], extents["rnumel"]) if "rnumel" in extents else None
        return split(self.cuts, extents["xnumel"])

    def func_name(self, name: str) -> str:
        """A member's Func: one a piece where the kernel is printed in pieces."""
        return name if self.piece is None else f"{name}_p{self.piece.number}"

    def index_text(self, expr: sympy.Expr, x: str = "x", r: str = "r", wide: bool = False) -> str:
        """`wide`: a value of int64, whose arithmetic on sizes (int32 parameters) runs in int64
        (n * n * 3 wrapped at 46341)."""
        names = {XINDEX: x, RINDEX: r}
        for symbol in expr.free_symbols - {XINDEX, RINDEX}:
            if not is_indirect(symbol) and str(symbol) not in self.sizes:
                self.sizes.append(str(symbol))
        if wide:
            names.update({s: f"hl.cast(hl.Int(64), {s})" for s in sizes_in_value_math(expr, (XINDEX, RINDEX))})
        return HalideIndexPrinter(names).doprint(expr)

    def rank_of(self, expr: sympy.Expr) -> int:
        symbols = sympy.sympify(expr).free_symbols
        rank = 2 if RINDEX in symbols else (1 if XINDEX in symbols else 0)
        # An index read at (r, x) makes a value of rank 2, in a reduction or a 2-D pointwise kernel
        # (an unfold's gather: as rank 1, a helper Func over x alone named r, which Halide refused).
        return max([rank] + [max(2 if self.plan.is_reduction else 1, self.indirect_rank.get(str(s), 0))
                             for s in symbols if is_indirect(s)])

    def input(self, buffer: str) -> str:
        if buffer not in self.inputs:
            self.inputs[buffer] = f"in_ptr{len(self.inputs)}"
        return self.inputs[buffer]

    def output(self, buffer: str) -> str:
        if buffer not in self.outputs:
            self.outputs[buffer] = f"out_ptr{len(self.outputs)}"
        return self.outputs[buffer]

    def ordered_outputs(self) -> list[tuple[str, str]]:
        """(buffer, output name) in the order the pipeline computes them: Halide runs each output's
        loop nest in turn, so an output that overwrites a buffer the kernel reads (an in-place
        update) comes after every output whose loop still reads the old values."""
        position = {n.write_name: n.position for n in self.plan.nodes}
        return sorted(self.outputs.items(), key=lambda item: (item[0] in self.inputs, position.get(item[0], 0)))

    def as_func(self, name: str, value: CSEVar, rank: int) -> CSEVar:
        """A Func holding value over () (rank 0), x (rank 1) or (r, x) (rank 2), called at the pure vars."""
        self.body.writeline(f'{name} = hl.Func("{name}")')
        pure = {0: "[()]", 1: "[x]", 2: "[r, x]"}[rank]
        self.body.writeline(f"{name}{pure} = {value}")
        return CSEVar(func_call(f"{name}{pure}"), value.dtype, rank)

    # ------------------------------------------------------------ members

    def load(self, buffer: str, index: sympy.Expr) -> CSEVar:
        fused = self.fused_value(buffer)
        if fused is not None:
            return fused
        dtype = self.graph.dtype_of(buffer)
        clamped = bool(self.mask_stack) or any(is_indirect(s) for s in index.free_symbols)
        self.schedule.gathers += clamped
        self.schedule.note_index(index)
        stored = self.plan.kept_in_input.get(buffer, buffer)  # see scheduler/schedule.py plan_memory
        text = f"{'load_clamped' if clamped else 'load'}({self.input(stored)}, {self.index_text(index)})"
        if self.tiles and self.tiles.transposes_loads and not clamped and self.transposes(index, *self._tile_axes()):
            text = self.tile_load(text).name
        if register_dtype(dtype) != dtype:
            text = self.widen(text, dtype)
        return self.emit(text, dtype, self.rank_of(index))

    @staticmethod
    def transposes(index: sympy.Expr, inner, outer) -> bool:
        """Whether index walks memory along inner (its step is 1) and strides along outer."""
        return stride_along(index, inner) == 1 and stride_along(index, outer) != 1 and outer in index.free_symbols

    def _tile_axes(self):
        """(inner, outer) of the loads the transposing store's tiles hold."""
        return (XINDEX, RINDEX) if self.tiles.store_along_r else (RINDEX, XINDEX)

    def _reads_across(self) -> list[sympy.Expr]:
        """The indices of a member's loads of inputs contiguous along x and strided along r."""
        produced = {n.write_name for n in self.plan.nodes}
        return [index for n in self.plan.nodes
                for name, index in n.reads_in_kernel(self.plan.placement[n.name], self.plan.xnumel, self.plan.rnumel)
                if name not in produced and self.transposes(index, XINDEX, RINDEX)]

    def tile_load(self, text: str) -> CSEVar:
        """A load contiguous along r in a transposing store: a Func over (r, x) the schedule keeps
        as a register tile, loaded a row per vector and read transposed."""
        if text not in self.tile_loads:
            name = f"tile{len(self.tile_loads)}"
            self.body.writeline(f'{name} = hl.Func("{name}")')
            self.body.writeline(f"{name}[r, x] = {text}")
            self.schedule.tile_load(name)
            self.tile_loads[text] = CSEVar(func_call(f"{name}[r, x]"), None, 2)
        return self.tile_loads[text]

    def reordered_store(self):
        """How a kernel whose one output is a pointwise (x, r) member over static extents walks its
        domain where the store and a load walk memory along different dims: in tiles where the
        store is contiguous along x (a transpose) or a load is (a channels-last copy back to NCHW),
        in chunks of r where the store interleaves rows (a channels-last copy of a few channels);
        None for any other kernel."""
        if self.plan.is_reduction or self.plan.has_scan:
            return None
        stores = [n for n in self.plan.nodes if n.write_name in self.plan.stored]
        if len(stores) != 1 or stores[0].is_scatter or self.plan.placement[stores[0].name] != Placement.XR:
            return None
        sizes = self.static_extents()
        if "xnumel" not in sizes or "rnumel" not in sizes:
            return None
        index = stores[0].store_index(Placement.XR, self.plan.xnumel, self.plan.rnumel)
        xnumel, rnumel = sizes["xnumel"], sizes["rnumel"]
        tiles = None
        if self.transposes(index, XINDEX, RINDEX):
            tiles = self.schedule.transpose_tiles(xnumel, rnumel, False, frozenset(periods_along(index, XINDEX)))
        elif self.transposes(index, RINDEX, XINDEX) and (across := self._reads_across()):
            periods = frozenset().union(*(periods_along(i, XINDEX) for i in across))
            tiles = self.schedule.transpose_tiles(xnumel, rnumel, True, periods)
        if tiles is not None:
            return tiles
        step = index.coeff(RINDEX)
        if not (step.is_Integer and RINDEX not in (index - step * RINDEX).free_symbols):
            return None
        return self.schedule.row_chunks(sizes["xnumel"], sizes["rnumel"], int(step),
                                        stores[0].buffer.get_dtype().itemsize)

    def compute(self, node) -> CSEVar:
        if node.name in self.node_values:
            return self.node_values[node.name]
        placement = self.plan.placement[node.name]
        value = self.body_value(node)
        ops = self.ops()
        if placement == Placement.SCAN:
            value = self.as_func(node.name, emit_scan(self, node, value), 2)
        elif placement == Placement.REDUCTION:
            dtype = node.data.src_dtype
            value = tuple(ops.to_dtype(v, dtype) for v in value) if isinstance(value, tuple) else ops.to_dtype(value, dtype)
            value = self.reduction(node, value)
        else:
            value = ops.to_dtype(value, node.data.dtype)
            if placement != Placement.XR and value.rank == 2 and self.piece is None:
                # A member over x alone reading a value stored per (r, x): only where a row is one
                # element (a softmax over a dim of size 1 reading its stored exp), so r is 0.
                rows = self.as_func(self.fresh(f"{node.name}_row"), value, 2)
                value = CSEVar(rows.name.replace("[r, x]", "[0, x]"), value.dtype, 1)
            # Inside a piece every member is over (r, x): the piece's runs and rows (pieces.py).
            rank = 2 if placement == Placement.XR or self.piece is not None else 1
            value = self.as_func(self.func_name(node.name), value, rank)
        self.node_values[node.name] = value
        return value

    def print_reduction(self, node, rtype: str, value) -> tuple[CSEVar, ...]:
        return emit_reduction(self, node.name, rtype, value)

    def store(self, node, value: CSEVar) -> None:
        placement = self.plan.placement[node.name]
        xr = placement in ROW_VALUED
        dtype = node.buffer.get_dtype()
        if register_dtype(value.dtype) != dtype or value.dtype != dtype:
            value = CSEVar(self.narrow(value.name, dtype, self.rounds_unguarded(value)), dtype, value.rank)
        if node.write_name in self.inputs:
            self.in_place.append((node, value, xr))  # written last, see write_in_place
            return
        self.write_output(node, value.name, xr)

    def write_output(self, node, value: str, xr: bool) -> None:
        """out[store index] = value over the member's domain; value is an Expr of the pure vars."""
        if self.piece is not None:
            return self.write_piece(node, value)
        placement = self.plan.placement[node.name]
        index = node.store_index(placement, self.plan.xnumel, self.plan.rnumel)
        self.schedule.note_index(index)
        dtype = node.buffer.get_dtype()
        out = self.output(node.write_name)
        domain = "xr_dom" if xr else self.row_domain
        x, r = (f"{domain}.y", f"{domain}.x") if xr else (f"{domain}.y" if domain == ROW_DOMAIN else f"{domain}.x", "0")
        if self.tiles:
            domain = f"{out}_tiles"
            self.body.writeline(f"{domain} = hl.RDom([{', '.join(f'(0, {n})' for n in self.tiles.extents())}], "
                                f'"{domain}")')
            x, r = self.tiles.coordinates(domain)
        value = value.replace("[r, x]", f"[{r}, {x}]").replace("[x]", f"[{x}]")
        self.body.writeline(f"{out} = hl.Func({self.storage_type(dtype)}, 1, \"{out}\")")
        self.body.writeline(f"{out}[x] = hl.undef({self.storage_type(dtype)})")
        where = self.index_text(index, x, r)
        if domain == ROW_DOMAIN:
            where += f" + {domain}.x"  # always 0: see ROW_DOMAIN
        self.body.writeline(f"{out}[in_output({out}, {where})] = {value}")
        if self.tiles:
            return self.schedule.transposed_output(out, self.tiles, domain)
        # A store that walks memory along x (a transpose; a channels-last reduction's per-element
        # output, x = n * C + c: x % C steps by 1) is vectorized along x, not r.
        along_x = xr and stride_along(index, RINDEX) != 1 and stride_along(index, XINDEX) == 1
        self.schedule.output(out, domain, xr, along_x)

    def write_piece(self, node, value: str) -> None:
        """out[store index] = value over the current piece: an update of the output per piece, over the
        piece's rows (y) of one run each (x), so the store is contiguous along x."""
        piece = self.piece
        dom, out, dtype = piece.domain, self.output(node.write_name), node.buffer.get_dtype()
        index = node.store_index(self.plan.placement[node.name], self.plan.xnumel, self.plan.rnumel)
        where = self.simplify(index.subs(piece.substitution(), simultaneous=True))
        self.schedule.note_index(where)
        if out not in self.piece_updates:
            self.body.writeline(f"{out} = hl.Func({self.storage_type(dtype)}, 1, \"{out}\")")
            self.body.writeline(f"{out}[x] = hl.undef({self.storage_type(dtype)})")
            self.piece_updates[out] = 0
        value = value.replace("[r, x]", f"[{dom}.x, {dom}.y]")
        self.body.writeline(f"{out}[in_output({out}, {self.index_text(where, f'{dom}.y', f'{dom}.x')})] = {value}")
        self.schedule.piece_output(out, self.piece_updates[out], piece)
        self.piece_updates[out] += 1

    def write_in_place(self) -> None:
        """Outputs that overwrite buffers the kernel reads. Halide runs each output's loop in turn:
        one in-place output goes last (ordered_outputs), reading each old value just before it
        replaces it. With several, one could overwrite what the next still reads, so their new
        values are first computed together into one staged Func, then written."""
        self.schedule.writes_in_place = bool(self.in_place)
        if len(self.in_place) < 2:
            for node, value, xr in self.in_place:
                self.write_output(node, value.name, xr)
            return
        for xr in (False, True):
            group = [(node, value) for node, value, on_xr in self.in_place if on_xr == xr]
            if not group:
                continue
            name = "staged_xr" if xr else "staged_x"
            pure = "[r, x]" if xr else "[x]"
            self.body.writeline(f"# {', '.join(n.write_name for n, _ in group)} are updated in place: staged first")
            self.body.writeline(f'{name} = hl.Func("{name}")')
            values = [v.name for _, v in group]
            self.body.writeline(f"{name}{pure} = {values[0] if len(values) == 1 else '(' + ', '.join(values) + ')'}")
            self.schedule.staged(name, xr)
            for k, (node, _) in enumerate(group):
                self.write_output(node, func_call(f"{name}{pure}" + (f"[{k}]" if len(group) > 1 else "")), xr)

    def describe_member(self, node) -> None:
        self.body.writeline(f"# {node.name}: {self.plan.placement[node.name]}"
                            f"{' ' + node.data.reduction_type if node.is_reduction else ''}")

    def emit_scatter(self, node) -> None:
        """out[position(x)] (mode)= value(x), in order of x: several x may land on one element."""
        mode = node.data.mode
        if mode not in (None, "atomic_add", "atomic_max", "atomic_min", "atomic_mul"):
            raise UnsupportedInHalide(f"smelt: scatter mode {mode!r} in Halide")
        if mode is not None and self.bf16_bits and node.buffer.get_dtype() == torch.bfloat16:
            raise UnsupportedInHalide(f"smelt: scatter mode {mode!r} into bfloat16 in Halide on the GPU")
        self.body.writeline(f"# {node.name}: scatter{' (' + mode + ')' if mode else ''}")
        value = self.compute(node)
        offset = self.scatter_offset(node)
        dtype = node.buffer.get_dtype()
        out = self.output(node.write_name)
        # The indirect positions are Exprs in the pure var x: the update reads them at x_dom.x.
        where = self.as_func(self.fresh("position"), CSEVar(self.index_text(offset), torch.int32, 1), 1)
        at = where.name.replace("[x]", "[x_dom.x]")
        incoming = value.name.replace("[x]", "[x_dom.x]")
        if register_dtype(value.dtype) != dtype or value.dtype != dtype:
            incoming = self.narrow(incoming, dtype, self.rounds_unguarded(value))
        target = f"{out}[in_output({out}, {at})]"
        old = func_call(target)
        combined = {None: incoming, "atomic_add": f"{old} + {incoming}", "atomic_mul": f"{old} * {incoming}",
                    "atomic_max": f"hl.max({old}, {incoming})", "atomic_min": f"hl.min({old}, {incoming})"}[mode]
        if mode in ("atomic_max", "atomic_min") and dtype.is_floating_point:
            pick = ">" if mode == "atomic_max" else "<"
            combined = f"hl.select(hl.is_nan({incoming}) | ({incoming} {pick} {old}), {incoming}, {old})"
        self.body.writeline(f"{out} = hl.Func({self.storage_type(dtype)}, 1, \"{out}\")")
        self.body.writeline(f"{out}[x] = hl.undef({self.storage_type(dtype)})")
        self.body.writeline(f"{target} = {combined}")
        self.schedule.scatter(out)

    # ------------------------------------------------------------ the module

    def generate_body(self) -> None:
        if self.pieces:
            return self.generate_pieces()
        self.tiles = self.reordered_store()
        stores = [n for n in self.plan.nodes if n.write_name in self.plan.stored]
        per_element = [self.plan.placement[n.name] in ROW_VALUED for n in stores]
        if not all(per_element):  # a per-row output, which walks row_dom beside per-element ones
            self.row_domain = self.schedule.row_output_domain(any(per_element))
        for node in self.plan.nodes:
            if node.is_extern:
                raise UnsupportedInHalide(f"smelt: extern {node.name} inside a Halide kernel")
            self.emit_member(node)
        self.write_in_place()

    def generate_pieces(self) -> None:
        """Every member printed once a piece, over the piece's own (r, x), from scratch: values differ
        between pieces, so nothing is shared between them but the inputs."""
        for piece in self.pieces:
            self.piece = piece
            self.node_values, self.reduction_results = {}, {}
            counter, self.cse = self.cse.counter, CSE()
            self.cse.counter = counter
            self.body.writeline(f"# piece {piece.number}: ({'x' if piece.var == XINDEX else 'r'} // {piece.divisor})"
                                f" % {piece.modulus} in [{piece.low}, {piece.high}), {piece.outer} run(s) of {piece.run}")
            self.body.writeline(f'{piece.domain} = hl.RDom([(0, {piece.inner}), (0, {piece.rows})], "{piece.domain}")')
            for node in self.plan.nodes:
                self.emit_member(node)
        self.piece = None
        self.body.lines = _without_unused_temporaries(self.body.lines)

    def source(self, name: str, comment_lines: list[str]) -> str:
        self.generate_body()
        for s in kernel_sizes_symbols(self.plan):
            if str(s) not in self.sizes:
                self.sizes.append(str(s))
        # xnumel and rnumel come last, as the wrapper passes them.
        sizes = [s for s in self.sizes if s not in ("xnumel", "rnumel")]
        launch_sizes = sizes + ["xnumel"] + (["rnumel"] if self.plan.blocks_2d else [])
        out = IndentedBuffer()
        out.writelines(comment_lines)
        out.writeline("import halide as hl")
        out.writeline()
        out.writeline("# Launch arguments in the order smelt's wrapper passes them: input buffers, output buffers, sizes.")
        out.writeline(f"INPUTS = {tuple(self.inputs.values())!r}")
        out.writeline(f"OUTPUTS = {tuple(name for _, name in self.ordered_outputs())!r}")
        out.writeline(f"SIZES = {tuple(launch_sizes)!r}")
        buffers = [*self.inputs, *(b for b, _ in self.ordered_outputs())]
        dtypes = tuple(str(self.graph.dtype_of(b)).removeprefix("torch.") for b in buffers)
        out.writeline(f"DTYPES = {dtypes!r}  # the launcher refuses others")
        out.writeline(f"DEVICE = {self.schedule.device!r}  # the target its schedule is for")
        body_text = "\n".join(self.body.lines)
        with_asserts = self.schedule.device != "cpu" or "hl.require(" in body_text
        out.writeline(f"ASSERTS = {with_asserts}  # built with Halide's asserts: on CUDA, or checking gathered indices")
        helpers = (LOAD_PROMISED if with_asserts else LOAD_PLAIN) + MODULE_HELPERS
        helpers += (random.PHILOX_HELPER if self.uses_random else "") + self.schedule.helpers()
        for special, source in {**SPECIAL_FUNCTIONS, **DIVISION_HELPERS, **CONVERSION_HELPERS}.items():
            if re.search(rf"(?<![\w.]){special}\(", body_text + helpers):
                helpers += source
        for line in helpers.splitlines():
            out.writeline(line)
        out.writeline()
        out.writeline()
        out.writeline(f"def {name}(schedule=True):")
        with out.indent():
            out.writeline('x, r = hl.Var("x"), hl.Var("r")')
            for buffer, param in self.inputs.items():
                out.writeline(f'{param} = hl.ImageParam({self.storage_type(self.graph.dtype_of(buffer))}, 1, "{param}")'
                              f"  # {buffer}")
            arguments = list(self.inputs.values())
            static = self.static_extents()
            for size in launch_sizes:
                extent = static.get(size)
                if extent is None:
                    out.writeline(f'{size} = hl.Param(hl.Int(32), "{size}")')
                    arguments.append(size)
                    continue
                # The wrapper still passes it; the algorithm uses the literal, so Halide sizes loops
                # and scratch buffers exactly (on the stack, no tail checks): 2048x2048 cumsum,
                # one thread 4.9 -> 3.9 ms; layer_norm's kernel compiles in 0.16 s, not 0.52 s.
                out.writeline(f'{size}_arg = hl.Param(hl.Int(32), "{size}")')
                out.writeline(f"{size} = hl.Expr({extent})")
                arguments.append(f"{size}_arg")
            out.writeline('x_dom = hl.RDom([(0, xnumel)], "x_dom")')
            if self.plan.blocks_2d:
                out.writeline('xr_dom = hl.RDom([(0, rnumel), (0, xnumel)], "xr_dom")')
                out.writeline('rdom = hl.RDom([(0, rnumel)], "rdom")')
            if self.row_domain == ROW_DOMAIN:
                out.writeline(ROW_DOMAIN_DECLARATION)
        out.splice(self.body)
        with out.indent():
            out.writeline()
            out.writeline("if schedule:  # without it: the algorithm alone, for an autoscheduler")
            with out.indent():
                out.writelines(self.schedule.lines() or ["pass"])
            outputs = ", ".join(name for _, name in self.ordered_outputs())
            out.writeline(f"return hl.Pipeline([{outputs}]), [{', '.join(arguments)}]")
        return out.getvalue()

    def static_extents(self) -> dict[str, int]:
        """xnumel and rnumel where the graph's shapes fix them (its index expressions hold them
        as literals already). Not an empty extent: a mean over it would divide by a literal 0,
        which Halide refuses to build (as a Param, it divides at run time, giving nan)."""
        extents = dict(zip(("xnumel", "rnumel"), self.plan.static_sizes()))
        return {name: value for name, value in extents.items() if value}

    def launch_args(self) -> tuple[list[tuple[str, str]], list[str]]:
        params = [(p, b) for b, p in self.inputs.items()] + [(p, b) for b, p in self.ordered_outputs()]
        sizes = [s for s in self.sizes if s not in ("xnumel", "rnumel")]
        return params, sizes
