"""Prints a KernelPlan as a Triton kernel."""
from __future__ import annotations

import dataclasses

import sympy
import torch

from ...artifact import BlockConfig
from ...ir.reduction_kinds import reduction_identity as identity
from ...ir.ops import is_indirect
from ...scheduler.kernel_plan import KernelPlan, kernel_sizes_symbols
from ...scheduler.nodes import RINDEX, XINDEX
from ...scheduler.placement import IN_ROW_LOOP, ROW_VALUED, Placement
from ...symbolic import next_power_of_2, pexpr, sizes_in_value_math, static_int, surely_below
from ..common import CSEVar, IndentedBuffer, KernelArgs, register_dtype
from ..kernel_body import PrintedKernel
from .eviction import EvictionPolicy
from .handler import INT32_LIMIT, TritonOps, _is_literal, graph_needs_int64
from .online_softmax import reduce_looped as online_softmax_looped
from .online_softmax import reduce_persistent as online_softmax_persistent
from .ops import COMBINE_HELPERS, cast_text, literal, triton_type
from .random import INTERPRETER_IMPORT
from .row_split import CHUNK, RowSplit, WARPS, row_split_for
from .scan import ScanEmitter
from .scatter import emit_scatter
from .tiles import tile_blocks, tile_program_ids


@dataclasses.dataclass
class TritonKernelSource:
    """A generated kernel and what the wrapper needs to launch it."""

    name: str
    source: str
    params: list[tuple[str, str]]  # (parameter, buffer name)
    size_args: list[str]  # size symbols, bound by name in the wrapper
    xnumel: sympy.Expr
    rnumel: sympy.Expr | None
    config: BlockConfig
    origins: list[str]
    candidates: list[BlockConfig] = dataclasses.field(default_factory=list)  # timed when autotuning
    workspace: tuple[int, int, int] | None = None  # row split: (programs per row, barriers, partial slots)
    ticket: bool = False  # its last program runs a finisher: launched with a ticket counter


# Fewest neighbouring outputs a compiled column reduction's program reads at once (a 128-byte line of float32).
MIN_COLUMN_XBLOCK = 32
# Rows this short (Swin's 49 keys), reduced whole and written back element by element (a softmax),
# run 512 elements a program (8 such rows) over 2 warps: its window softmax took 175 / 89 / 52 us (at 6144, 3072 and 1536
# windows of 49 x 49, H200) in 64 rows over 8 warps, 92 / 49 / 40 so; a plain softmax over 49-long
# rows 61 -> 56 us (benchmarks/probes/short_rows.py).
SHORT_ROW = 64
# A row reduction packs several rows into a program only while that leaves at least this many
# programs (an H100 has 132 SMs).
MIN_ROW_PROGRAMS = 128
# Elements a warp holds in a reduction kernel outside the tuned branches below (column reductions,
# looped rows). benchmarks/probes/row_warps.py sweeps it.
ELEMENTS_PER_WARP = 512
# The same for a persistent kernel over whole contiguous rows written back element by element (softmax,
# norms): apart from the rest, whose column reductions (a norm's weight gradient) also take their
# warps from ELEMENTS_PER_WARP. 1024 against 512 on an H100: no row case more than 1.5% slower, a LayerNorm's
# forward + backward 1.02-1.13x faster, BERT's 24 residual + norm kernels 205 -> 180 us (RESULTS.md, 2026-12-07).
ROW_ELEMENTS_PER_WARP = 1024
# How a whole row in registers takes its mean and variance: "shifted" (three reductions: the row's first
# value, the shifted sum, the centred squares) or "welford" (one reduction of Welford's combine over
# (value, 0, 1) per lane). Both give a row of equal values exactly its value and 0, as eager's Welford.
# benchmarks/probes/norm_variants.py compares them.
PERSISTENT_WELFORD = "shifted"


# A looped float32 sum or Welford over more blocks than this moves its lane partials into float64
# ones every FLUSH_STEPS blocks (_flushes).
FLUSH_STEPS = 16


def _block_shrink(plan: KernelPlan) -> int:
    """How many times smaller than usual a pointwise kernel's block is, by the loads each element
    makes: with many loads in flight per element a full block runs out of registers, most likely
    (a 7x7 depthwise convolution's 98 loads: ConvNeXt's first stage took 347-439 us in a 128 x 64
    tile, 196-197 us in an eighth of it with 4 warps, H100; `benchmarks/probes/depthwise_conv.py
    --sweep-blocks`)."""
    if plan.is_reduction:
        return 1
    loads = sum(len(n.reads) for n in plan.nodes if not n.is_extern)
    return min(8, next_power_of_2(max(1, loads // 12)))


def choose_blocks(plan: KernelPlan, interpret: bool, persistent_limit: int) -> BlockConfig:
    """Block sizes from a heuristic: whole rows in registers when short enough, else loop over r."""
    xn, rn = plan.static_sizes()
    # Elements one program handles. The interpreter runs each program as numpy calls: big blocks
    # for pointwise work, smaller ones for reductions, where some combines run element by element.
    budget = (1 << 16 if not plan.is_reduction else 4096) if interpret else 4096
    shrink = 1 if interpret else _block_shrink(plan)
    if plan.tiling is not None:
        itemsize = max(n.buffer.get_dtype().itemsize for n in plan.nodes)
        tiles = tile_blocks(plan.tiling, itemsize, interpret, shrink)
        return BlockConfig(tiles.xblock, tiles.rblock, tiles.num_warps, False, tiles=tiles)
    if not plan.is_reduction:
        xblock = 1024 // shrink if not interpret else min(budget, next_power_of_2(xn) if xn else budget)
        if xn is not None:
            xblock = max(1, min(xblock, next_power_of_2(xn)))
        return BlockConfig(xblock, None, 4 if xblock >= 512 else 2, False)
    row_split = row_split_for(plan, interpret, persistent_limit)
    if row_split > 1:
        return BlockConfig(1, CHUNK, WARPS, True, row_split)
    # A column reduction (r strided in memory) reads coalesced only across x, so a persistent one
    # must leave room for enough columns per program beside its whole column.
    persistent = rn is not None and rn <= persistent_limit and (
        interpret or rn * MIN_COLUMN_XBLOCK <= budget or plan.r_contiguous())
    if persistent:
        rblock = next_power_of_2(rn)
    else:
        rblock = _looped_row_block(plan) if plan.r_contiguous() else 64
        if interpret:
            rblock = 128
    max_warps = 16
    if persistent and not interpret and plan.r_contiguous() and not plan.stores_per_element():
        # Rows reduced to one value each: one row of up to 2048 per program at 256 elements a warp,
        # at most 8 warps (on an H100: var_mean over 2048-wide rows at 94% of copy bandwidth against
        # 90-92% with two rows a program or 512 elements a warp; chunks of 4096 of a global sum at
        # 93% with 8 warps, 91% with 4; benchmarks/probes/reduction_variants.py).
        budget = 2048
        elements_per_warp = 256
        max_warps = 8
    elif persistent and not interpret and rblock <= SHORT_ROW and plan.r_contiguous():
        budget = 512
        elements_per_warp = 256
    elif persistent and not interpret and plan.r_contiguous():
        elements_per_warp = ROW_ELEMENTS_PER_WARP
    else:
        elements_per_warp = ELEMENTS_PER_WARP
    xblock = max(1, budget // rblock) if (interpret or not plan.r_contiguous() or persistent) else 1
    if not interpret:
        xblock = min(xblock, 64)
        if xn is not None and plan.r_contiguous():
            # Few rows: one program per row sooner than idle SMs (a split's 32 chunks of cross
            # entropy's per-row gathers ran on 4 programs of 8 chunks).
            xblock = min(xblock, max(1, next_power_of_2(xn // MIN_ROW_PROGRAMS + 1) // 2))
    if xn is not None:
        xblock = min(xblock, next_power_of_2(xn))
    num_warps = min(max_warps, max(2, next_power_of_2(xblock * rblock // elements_per_warp)))
    return BlockConfig(xblock, rblock, num_warps, persistent)


def _looped_row_block(plan: KernelPlan) -> int:
    """Elements of a contiguous row one loop step reads. Measured on an H100
    (benchmarks/probes/reduction_variants.py): 2048 at 4 warps beats 1024 at 2 by 1-2% on sums; an online
    softmax takes a cross-warp max every step and amortizes it over 4096 (93% of copy bandwidth,
    against 88% at 1024)."""
    online = any(n.is_reduction and n.data.reduction_type == "online_softmax_reduce" for n in plan.nodes)
    return 4096 if online else 2048


def masks_needed(plan, configs) -> tuple[bool, bool]:
    """(x mask, r mask) that make the one source correct for every candidate."""
    xn, rn = plan.static_sizes()
    need_x = xn is None or any(xn % c.XBLOCK for c in configs)
    need_r = plan.blocks_2d and (rn is None or rn == 0 or any(rn % c.RBLOCK for c in configs))
    return need_x, need_r


def kernel_name(plan: KernelPlan, config: BlockConfig, index: int) -> str:
    kind = "poi" if not plan.is_reduction else ("per" if config.persistent else "red")
    if config.row_split > 1:
        kind = "rowsplit"  # not a split reduction: one kernel whose programs share rows
    # "aten._softmax.default" -> "softmax"
    ops = sorted({o.split(".")[1].strip("_") if o.count(".") >= 1 else o for n in plan.nodes for o in n.buffer.origins})
    ops = [o for o in ops if o][:5]
    return f"triton_{kind}_fused_{'_'.join(ops) or 'copy'}_{index}"


class TritonKernel(PrintedKernel):
    """Generates the body of one kernel by running each member's loop body under TritonOps."""

    def __init__(self, plan: KernelPlan, config: BlockConfig, graph, index_dtype: str, interpret: bool,
                 masks: tuple[bool, bool] | None = None, eviction_hints: bool = True, finisher=None,
                 program_arg: bool = False, coherent: frozenset[str] = frozenset()):
        super().__init__(plan, graph)
        self.finisher = finisher  # finisher.Finisher: run by the last program to finish
        # A finisher's body is a function called per x block: its program id comes as `pid`.
        self.program_arg = program_arg
        self.coherent = coherent  # buffers other programs of this launch wrote: read through L2
        self.interpret = interpret
        self.config = config
        self.args = KernelArgs()
        self.helpers: set[str] = set()
        self.helper_sources: dict[str, str] = {}  # functions made for this kernel (scan combines)
        self.scans = ScanEmitter(self)
        self.index_dtype = index_dtype
        self.mask_ranks: dict[str, int] = {}  # a mask_stack entry -> its rank
        self.indirect_ranks: dict[str, int] = {}  # indirect index variable -> its rank
        self.deferred_stores: list = []
        self.uses_random = False  # set by the random ops: interpreted kernels import Philox then
        self.index_exprs: dict[str, sympy.Expr] = {}  # CSE name of an index_expr value -> its expression
        self.row_split = RowSplit(self, config.row_split) if config.row_split > 1 else None
        self.eviction = EvictionPolicy(plan, config.persistent, eviction_hints)
        self.phase = 0  # the pass over r being generated
        self.loop_prologue: IndentedBuffer | None = None
        self.loop_epilogue: IndentedBuffer | None = None
        self.loop_flush: IndentedBuffer | None = None  # lines run every FLUSH_STEPS loop steps
        # An empty row (rnumel == 0) still runs one masked block, which yields the identity.
        self.need_xmask, self.need_rmask = masks or masks_needed(plan, [config])
        if config.tiles is not None and config.tiles.fold_axis1:  # the folded axis overshoots
            if config.tiles.grid_axes[1] == "x":
                self.need_xmask = True
            else:
                self.need_rmask = True

    def ops(self) -> TritonOps:
        return TritonOps(self)

    # ------------------------------------------------------------ values

    def rank_of(self, expr: sympy.Expr) -> int:
        symbols = sympy.sympify(expr).free_symbols
        rank = 2 if RINDEX in symbols else (1 if XINDEX in symbols else 0)
        return max([rank] + [self.indirect_ranks[str(s)] for s in symbols if str(s) in self.indirect_ranks])

    def index_text(self, expr: sympy.Expr, wide: bool = False) -> str:
        """`wide`: a value of int64, whose arithmetic on sizes runs in int64: Triton types a size
        argument under 2**31 as int32 whatever the kernel's index type (n * n * 3 wrapped at 46341)."""
        for symbol in expr.free_symbols - {XINDEX, RINDEX}:
            if not is_indirect(symbol):
                self.args.size(str(symbol))
        if wide:
            sizes = sizes_in_value_math(expr, (XINDEX, RINDEX))
            expr = expr.subs({s: sympy.Symbol(f"{s}.to(tl.int64)", integer=True) for s in sizes}) if sizes else expr
        return pexpr(expr)

    def mask_for(self, rank: int, region: bool = True) -> str | None:
        """The mask of a block of `rank`: the lanes past x's and r's ends, and (with `region`)
        the conditions of the masked() regions around it."""
        parts = []
        if rank >= 1 and self.need_xmask:
            parts.append("xmask")
        if rank >= 2 and self.need_rmask:
            parts.append("rmask")
        if region:
            parts += self.mask_stack
        if self.interpret and parts and any(self.mask_ranks.get(m, 1) == 0 for m in self.mask_stack):
            # The interpreter's `&` of a bool block and a 0-d bool gives int64, which its load
            # refuses as a mask (a scalar cat-piece test beside xmask in a combo kernel); and it
            # broadcasts a 0-d bool to a block as int32 data, so a mask of 0-d values alone beside
            # a block access is broadcast first, then compared.
            mask = f"({' & '.join(parts)})"
            if rank and all(self.mask_ranks.get(m, 1) == 0 for m in parts):
                return f"(tl.broadcast_to({mask}, {self.block_shape(rank)}) != 0)"
            if len(parts) > 1:
                return f"({mask} != 0)"
        return " & ".join(parts) if parts else None

    def load(self, buffer: str, index: sympy.Expr) -> CSEVar:
        fused = self.fused_value(buffer)
        if fused is not None:
            return fused
        dtype = self._dtype_of(buffer)
        if buffer in self.graph.host_scalars:  # its one value, passed by the wrapper as a float64
            value = self.args.size(self.graph.host_scalars[buffer])
            return self.emit(f"tl.full([], {value}, {triton_type(dtype)})", dtype, 0)
        rank = self.rank_of(index)
        ptr = self.args.input(self.plan.kept_in_input.get(buffer, buffer))
        address = f"{ptr} + ({self.index_text(index)})"
        if rank == 2 and self.reads_one_tile_row(index):
            # The same r values for every x of the tile (a per-channel scale over NHWC, a depthwise
            # convolution's weights): one [1, RBLOCK] load, not one per element of the tile.
            mask = "rmask" if self.need_rmask else None
        elif rank:
            mask = self.mask_for(rank, region=not self._in_bounds(buffer, index))
        else:
            # A fixed address is in bounds unless its buffer is empty, as a cat's empty piece is:
            # a load under masked() keeps the mask. A block mask needs a block of pointers.
            mask = " & ".join(self.mask_stack) if self.mask_stack else None
            mask_rank = max((self.mask_ranks.get(m, 0) for m in self.mask_stack), default=0)
            if mask_rank:
                rank = mask_rank
                mask = self.mask_for(rank)  # with xmask: a piece's mask may hold past the last x
                address = f"tl.broadcast_to({address}, ({mask}).shape)"
        if self.reads_rows_without_r(rank):
            # A value per (x, r) read without rindex: with empty rows its buffer may be empty (an
            # expand to size 0, whose pointer is null) and no lane wants the value. (Beside a
            # block mask the test is a block too: the interpreter's scalar comparison is a Python
            # bool, which `&` with a block makes an int32 mask.)
            rows = "(xindex * 0 < rnumel)" if rank else "(rnumel > 0)"
            mask = f"{mask} & {rows}" if mask else rows
        text = f"tl.load({address}"
        if mask:
            text += f", {mask}, other={literal(0, dtype)}"
        policy = self.eviction.for_load(buffer, index, rank, self.phase)
        if buffer in self.coherent:
            text += ", cache_modifier='.cg'"
            policy = None  # PTX takes no L1 eviction hint on a load that skips L1
        text += f", eviction_policy='{policy}')" if policy else ")"
        if register_dtype(dtype) != dtype:
            text += f".to({triton_type(register_dtype(dtype))})"
        return self.emit(text, dtype, rank)

    def _in_bounds(self, buffer: str, index: sympy.Expr) -> bool:
        """Whether a load inside masked() regions reads inside its buffer on every lane, so needs
        none of their conditions (the region's tl.where still picks its value). A value of x alone
        then stays one per row: a batch norm's per-channel parameters under a split reduction's
        tail mask were loaded per element, with a square root and two divisions each
        (EfficientNet's squeeze means, 54 us where Inductor's of the kind take 8 on the H200)."""
        if not self.mask_stack or buffer in self.plan.kept_in_input:
            return False
        index = sympy.sympify(index)
        if index.free_symbols - {XINDEX, RINDEX}:
            return False  # a size symbol or an indirect index: not bounded here
        numel = static_int(self.graph.storage_numel_of(buffer))
        xn, rn = self.plan.static_sizes()
        if numel is None or xn is None or (RINDEX in index.free_symbols and rn is None):
            return False
        ranges = {XINDEX: xn, **({RINDEX: rn} if rn is not None else {})}
        return surely_below(index, ranges, numel)

    def reads_one_tile_row(self, index: sympy.Expr) -> bool:
        """Whether a load at `index` in a tiled pointwise kernel reads along r alone, unmasked
        by anything of x: broadcast by the arithmetic (and by tl.store) to the tile."""
        if self.plan.tiling is None or self.mask_stack:
            return False
        symbols = sympy.sympify(index).free_symbols
        return XINDEX not in symbols and not any(self.indirect_ranks.get(str(s), 0) == 1 for s in symbols)

    def _dtype_of(self, buffer: str) -> torch.dtype:
        return self.graph.dtype_of(buffer)

    # ------------------------------------------------------------ members

    def compute(self, node) -> CSEVar:
        placement = self.plan.placement[node.name]
        value = self.body_value(node)
        if placement == Placement.SCAN:
            return self.scans.scan(node, value)  # made per (x, r) like an xr value, so not kept
        dtype = node.data.src_dtype if placement == Placement.REDUCTION else node.data.dtype
        if isinstance(value, tuple):  # a reduction over tuples (welford_combine)
            value = tuple(self.ops().to_dtype(v, dtype) for v in value)
        else:
            value = self.ops().to_dtype(value, dtype)
        if placement == Placement.REDUCTION:
            value = self.reduction(node, value)
        if placement != Placement.XR or self.plan.tiling is not None:  # a tiled kernel has no loop to leave
            self.node_values[node.name] = value
        return value

    def store(self, node, value: CSEVar) -> None:
        placement = self.plan.placement[node.name]
        rank = 2 if placement in ROW_VALUED else 1
        index = node.store_index(placement, self.plan.xnumel, self.plan.rnumel)
        dtype = node.buffer.get_dtype()
        text = value.name
        if value.rank == 0 and _is_literal(text):
            text = f"tl.full({self.block_shape(rank)}, {text}, {triton_type(register_dtype(value.dtype))})"
        elif value.rank < rank or self.rank_of(index) < rank:
            text = f"tl.broadcast_to({text}, {self.block_shape(rank)})"
        if register_dtype(value.dtype) != dtype:
            text = self.cast(text, register_dtype(value.dtype), dtype)
        ptr = self.args.output(node.write_name)
        index_text = self.index_block(index, rank)
        mask = self.mask_for(rank)
        self.body.writeline(f"tl.store({ptr} + ({index_text}), {text}{', ' + mask if mask else ''})")

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        return cast_text(value, src, dst, self.interpret)

    def reads_rows_without_r(self, rank: int) -> bool:
        """Whether the member being printed uses a value of `rank` < 2 per (x, r) in a kernel whose
        rows may be empty: then no lane may want it, and its buffer may be empty."""
        reader = self.current[-1] if self.current else None
        return rank < 2 and reader is not None and self.plan.placement[reader.name] != Placement.X and \
            self.rows_may_be_empty()

    def rows_may_be_empty(self) -> bool:
        if not self.plan.blocks_2d:
            return False
        rn = self.plan.static_sizes()[1]
        return rn is None or rn == 0

    def index_block(self, index: sympy.Expr, rank: int) -> str:
        """index's text as a block of `rank`, for a store's pointers."""
        if self.rank_of(index) >= rank:
            return self.index_text(index)
        if index.is_Integer:  # a literal is no tensor to broadcast (a one-element as_strided view at 1)
            kind = "tl.int32" if abs(int(index)) < 2 ** 31 else "tl.int64"
            return f"tl.full({self.block_shape(rank)}, {int(index)}, {kind})"
        return f"tl.broadcast_to({self.index_text(index)}, {self.block_shape(rank)})"

    def block_shape(self, rank: int) -> str:
        if not self.plan.blocks_2d:
            return "[XBLOCK]"
        return "[XBLOCK, 1]" if rank == 1 else "[XBLOCK, RBLOCK]"

    def emit_scatter(self, node) -> None:
        emit_scatter(self, node)

    # ------------------------------------------------------------ reductions

    def print_reduction(self, node, rtype: str, value) -> tuple[CSEVar, ...]:
        value = tuple(map(self._as_block, value)) if isinstance(value, tuple) else self._as_block(value)
        if not self.config.persistent:
            return self._reduce_looped(rtype, value)
        results = self._reduce_persistent(rtype, value)
        return self.row_split.exchange(rtype, results) if self.row_split is not None else results

    def _as_block(self, value: CSEVar) -> CSEVar:
        """value broadcast to [XBLOCK, RBLOCK]."""
        if value.rank == 0 and _is_literal(value.name):
            full = f"tl.full([XBLOCK, RBLOCK], {value}, {triton_type(register_dtype(value.dtype))})"
            return self.emit(full, value.dtype, 2)
        if value.rank < 2:
            return self.emit(f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])", value.dtype, 2)
        return value

    def _masked(self, value: CSEVar, fill) -> str:
        mask = self.mask_for(2)
        if not mask:
            return value.name
        dtype = register_dtype(value.dtype)
        fill_text = literal(fill, dtype)
        if not dtype.is_floating_point and dtype != torch.bool and not -2 ** 31 <= int(fill_text) < 2 ** 31:
            # A value made of int literals alone is an int32 in Triton (tl.where(c, -1, 0) of an
            # int64 masked_fill): a bare -2**63 next to it does not fit. Typed, it widens the value.
            fill_text = f"tl.full([], {fill_text}, {triton_type(dtype)})"
        return f"tl.where({mask}, {value}, {fill_text})"

    def _combine_name(self, rtype: str, dtype: torch.dtype) -> str:
        if rtype == "sum":
            return "tl.standard._sum_combine"  # what tl.sum uses; the interpreter runs it natively
        base = {"sum": "sum", "max": "max", "min": "min", "prod": "prod", "argmax": "argmax", "argmin": "argmin",
                "welford_reduce": "welford", "welford_combine": "welford"}[rtype]
        if rtype in ("max", "min") and not dtype.is_floating_point:
            base = "int_" + base
        name = f"_{base}_combine"
        self.helpers.add(name)
        return name

    def _reduce_persistent(self, rtype: str, value) -> tuple[CSEVar, ...]:
        if rtype == "online_softmax_reduce":
            return online_softmax_persistent(self, value)
        if rtype == "welford_combine":
            # Masked-off lanes are empty partials (count 0), which the combine leaves out. tl.reduce
            # wants operands of one shape: a part made from rindex alone is [1, RBLOCK].
            parts = ", ".join(f"tl.broadcast_to({self._masked(v, 0)}, [XBLOCK, RBLOCK])" for v in value)
            dtype = register_dtype(value[0].dtype)
            merged = self.emit(f"tl.reduce(({parts}), 1, {self._combine_name(rtype, dtype)})", dtype, 1)
            return tuple(self.emit(f"{merged}[{k}][:, None]", dtype, 1) for k in range(3))
        dtype = register_dtype(value.dtype)
        masked = self._masked(value, identity(rtype, value.dtype))
        if rtype == "sum":
            return (self.emit(f"tl.reduce({masked}, 1, {self._combine_name('sum', dtype)})[:, None]", dtype, 1),)
        if rtype in ("max", "min") and self.interpret:
            return (self._interpreted_extreme(rtype, self.emit(masked, value.dtype, 2), dtype),)
        if rtype in ("max", "min", "prod"):
            return (self.emit(f"tl.reduce({masked}, 1, {self._combine_name(rtype, dtype)})[:, None]", dtype, 1),)
        if rtype in ("any", "all"):
            as_int = self.emit(f"({masked}).to(tl.int8)", torch.int8, 2)
            extreme = self._extreme_of("max" if rtype == "any" else "min", as_int, torch.int8)
            return (self.emit(f"{extreme} != 0", torch.bool, 1),)
        if rtype in ("argmax", "argmin"):
            masked_var = self.emit(masked, value.dtype, 2)
            positions = self.emit("tl.broadcast_to(rindex, [XBLOCK, RBLOCK])", torch.int64, 2)
            pair = self.emit(f"tl.reduce(({masked_var}, {positions}), 1, {self._combine_name(rtype, dtype)})",
                             torch.int64, 1)
            return (self.emit(f"{pair}[1][:, None]", torch.int64, 1),)
        if rtype == "welford_reduce" and PERSISTENT_WELFORD == "welford":
            zeros = self.emit(f"tl.full([XBLOCK, RBLOCK], 0.0, {triton_type(dtype)})", dtype, 2)
            ones = self.emit(f"tl.full([XBLOCK, RBLOCK], 1.0, {triton_type(dtype)})", dtype, 2)
            return self._reduce_persistent("welford_combine", (value, zeros, ones))
        if rtype == "welford_reduce":
            # Whole rows are in registers: the exact two-pass formula costs nothing extra. Shifted by
            # the row's first element (0 where not finite), as eager's Welford starts from it: a row
            # of equal values has a mean of exactly that value and m2 exactly 0 (std's gradient
            # there is 0 in eager; a mean one ulp off made it 0.4).
            count = "rnumel"
            add = self._combine_name("sum", dtype)
            head = self.emit(f"tl.reduce(tl.where(rbase == 0, {value}, 0.0), 1, {add})[:, None]", dtype, 1)
            shift = self.emit(f'tl.where(tl.abs({head}) < float("inf"), {head}, 0.0)', dtype, 1)
            shifted = self._masked(self.emit(f"{value} - {shift}", dtype, 2), 0)
            mean = self.emit(f"{shift} + tl.reduce({shifted}, 1, {add})[:, None] / {count}", dtype, 1)
            centered = self.emit(f"{value} - {mean}", dtype, 2)
            squares = self._masked(self.emit(f"{centered} * {centered}", dtype, 2), 0)
            m2 = self.emit(f"tl.reduce({squares}, 1, {add})[:, None]", dtype, 1)
            # Every lane of a persistent row counts, so the third Welford output is just rnumel.
            return mean, m2, CSEVar(count, dtype, 0)
        raise NotImplementedError(f"smelt: reduction {rtype} in Triton")

    def _extreme_of(self, rtype: str, block: CSEVar, dtype: torch.dtype) -> CSEVar:
        if self.interpret:
            return self._interpreted_extreme(rtype, block, dtype)
        return self.emit(f"tl.reduce({block}, 1, {self._combine_name(rtype, dtype)})[:, None]", dtype, 1)

    def _interpreted_extreme(self, rtype: str, block: CSEVar, dtype: torch.dtype) -> CSEVar:
        """max/min through Triton's own combine, which the interpreter runs with numpy (a custom
        combine runs element by element in Python). numpy's nanmax skips NaN; eager's amax
        returns NaN, so NaN is put back explicitly."""
        combine = "tl.standard._elementwise_max" if rtype == "max" else "tl.standard._elementwise_min"
        result = self.emit(f"tl.reduce({block}, 1, {combine})[:, None]", dtype, 1)
        if not dtype.is_floating_point:
            return result
        nan_count = self.emit(f"tl.reduce(({block} != {block}).to(tl.int32), 1, tl.standard._sum_combine)[:, None]",
                              torch.int32, 1)
        return self.emit(f'tl.where({nan_count} > 0, float("nan"), {result})', dtype, 1)

    def _reduce_looped(self, rtype: str, value) -> tuple[CSEVar, ...]:
        if rtype == "online_softmax_reduce":
            return online_softmax_looped(self, value)
        pro, epi = self.loop_prologue, self.loop_epilogue
        acc = f"acc{self.cse.counter}"
        self.cse.counter += 1
        if rtype == "welford_combine":
            return self._combine_looped(acc, value)
        dtype = register_dtype(value.dtype)
        ttype = triton_type(dtype)
        fill = identity(rtype, value.dtype)
        masked = self._masked(value, fill)
        wide = self._flushes(rtype, dtype)
        if rtype in ("sum", "prod", "max", "min", "any", "all"):
            acc_dtype = "tl.int8" if rtype in ("any", "all") else ttype
            pro.writeline(f"{acc} = tl.full([XBLOCK, RBLOCK], {literal(fill, dtype)}, {acc_dtype})")
            update = {
                "sum": f"{acc} + {masked}",
                "prod": f"{acc} * {masked}",
                "any": f"tl.maximum({acc}, ({masked}).to(tl.int8))",
                "all": f"tl.minimum({acc}, ({masked}).to(tl.int8))",
            }.get(rtype) or f"{self._combine_name(rtype, dtype)}({acc}, {masked})"
            self.body.writeline(f"{acc} = {update}")
            if wide:
                pro.writeline(f"{acc}_wide = tl.full([XBLOCK, RBLOCK], 0, tl.float64)")
                self.loop_flush.writeline(f"{acc}_wide = {acc}_wide + {acc}.to(tl.float64)")
                self.loop_flush.writeline(f"{acc} = tl.full([XBLOCK, RBLOCK], 0, {ttype})")
            result = CSEVar(f"{acc}_result", dtype if rtype not in ("any", "all") else torch.bool, 1)
            if rtype in ("max", "min", "any", "all"):
                kind = {"any": "max", "all": "min"}.get(rtype, rtype)
                body, self.body = self.body, epi
                extreme = self._extreme_of(kind, CSEVar(acc, torch.int8 if kind != rtype else dtype, 2),
                                           torch.int8 if kind != rtype else dtype)
                self.body = body
                final = f"{extreme} != 0" if rtype in ("any", "all") else extreme.name
            elif wide:
                final = f"tl.reduce({acc}_wide, 1, {self._combine_name(rtype, dtype)})[:, None].to({ttype})"
            else:
                final = f"tl.reduce({acc}, 1, {self._combine_name(rtype, dtype)})[:, None]"
            epi.writeline(f"{result} = {final}")
            return (result,)
        if rtype in ("argmax", "argmin"):
            combine = self._combine_name(rtype, dtype)
            pro.writeline(f"{acc} = tl.full([XBLOCK, RBLOCK], {literal(fill, dtype)}, {ttype})")
            pro.writeline(f"{acc}_index = tl.full([XBLOCK, RBLOCK], 0, tl.int64)")
            self.body.writeline(f"{acc}, {acc}_index = {combine}({acc}, {acc}_index, {masked}, "
                                f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64))")
            result = CSEVar(f"{acc}_result", torch.int64, 1)
            epi.writeline(f"_, {result} = tl.reduce(({acc}, {acc}_index), 1, {combine})")
            epi.writeline(f"{result} = {result}[:, None]")
            return (result,)
        if rtype == "welford_reduce":
            parts = ("mean", "m2", "count")
            for part in parts:
                pro.writeline(f"{acc}_{part} = tl.full([XBLOCK, RBLOCK], 0, {ttype})")
            mask = self.mask_for(2)
            ones = f"({mask}).to({ttype})" if mask else "1.0"
            self.body.writeline(f"{acc}_count_next = {acc}_count + {ones}")
            self.body.writeline(f"{acc}_delta = {value} - {acc}_mean")
            share = f"{acc}_delta / tl.maximum({acc}_count_next, 1.0)"
            self.body.writeline(f"{acc}_mean_next = {acc}_mean + " + (f"tl.where({mask}, {share}, 0.0)" if mask else share))
            growth = f"{acc}_delta * ({value} - {acc}_mean_next)"
            self.body.writeline(f"{acc}_m2 = {acc}_m2 + " + (f"tl.where({mask}, {growth}, 0.0)" if mask else growth))
            self.body.writeline(f"{acc}_mean = {acc}_mean_next")
            self.body.writeline(f"{acc}_count = {acc}_count_next")
            combine = self._combine_name(rtype, dtype)
            lanes = ", ".join(f"{acc}_{p}" for p in parts)
            if wide:
                wides = ", ".join(f"{acc}_{p}_wide" for p in parts)
                for part in parts:
                    pro.writeline(f"{acc}_{part}_wide = tl.full([XBLOCK, RBLOCK], 0, tl.float64)")
                merge = f"{wides} = {combine}({wides}, " + ", ".join(f"{acc}_{p}.to(tl.float64)" for p in parts) + ")"
                self.loop_flush.writeline(merge)
                for part in parts:
                    self.loop_flush.writeline(f"{acc}_{part} = tl.full([XBLOCK, RBLOCK], 0, {ttype})")
                lanes = wides
            epi.writeline(f"{acc}_mean_r, {acc}_m2_r, {acc}_count_r = tl.reduce(({lanes}), 1, {combine})")
            narrow = f".to({ttype})" if wide else ""
            return tuple(CSEVar(f"{acc}_{p}_r[:, None]{narrow}", dtype, 1) for p in parts)
        raise NotImplementedError(f"smelt: reduction {rtype} in Triton")

    def _flushes(self, rtype: str, dtype: torch.dtype) -> bool:
        """Whether a looped float32 sum or Welford moves its lane partials into float64 ones after
        each run of FLUSH_STEPS blocks (_emit_loop nests the loop in runs). Each lane adds up one value a loop step; over many
        steps (a row of unknown length, or longer than FLUSH_STEPS blocks) float32 lanes drifted:
        on the H100 the sum of squares of 64M values of unknown length ended 2.5e-6 off and
        var_mean's var 2.6e-6 (Inductor, which splits such rows: 4e-9 and 6e-8). Lanes kept in
        float64 throughout were as exact but up to 2x slower (a loop's latency in float64 adds)."""
        if rtype not in ("sum", "welford_reduce") or dtype != torch.float32:
            return False
        rnumel = static_int(self.plan.rnumel)
        return rnumel is None or rnumel > self.config.RBLOCK * FLUSH_STEPS

    def _combine_looped(self, acc: str, value: tuple[CSEVar, ...]) -> tuple[CSEVar, ...]:
        """welford_combine over r blocks: each lane merges its partials in; masked-off lanes are
        empty partials (count 0), which leave it unchanged."""
        dtype = register_dtype(value[0].dtype)
        parts = ("mean", "m2", "count")
        for part in parts:
            self.loop_prologue.writeline(f"{acc}_{part} = tl.full([XBLOCK, RBLOCK], 0, {triton_type(dtype)})")
        state = ", ".join(f"{acc}_{p}" for p in parts)
        combine = self._combine_name("welford_combine", dtype)
        incoming = ", ".join(self._masked(v, 0) for v in value)
        self.body.writeline(f"{state} = {combine}({state}, {incoming})")
        self.loop_epilogue.writeline(f"{acc}_mean_r, {acc}_m2_r, {acc}_count_r = tl.reduce(({state}), 1, {combine})")
        return tuple(CSEVar(f"{acc}_{p}_r[:, None]", dtype, 1) for p in parts)

    # ------------------------------------------------------------ structure

    def generate_body(self) -> None:
        plan = self.plan
        if not plan.is_reduction:
            for node in plan.nodes:
                self.emit_member(node)
            return
        if self.config.persistent:
            self.body.writeline(self.row_split.rindex_line() if self.row_split else "rindex = rbase")
            if self.need_rmask:
                self.body.writeline("rmask = rindex < rnumel")
        for phase in range(plan.num_phases):
            self.phase = phase
            for node in plan.members_of_phase(phase, (Placement.X,)):
                self.emit_member(node)
            looped = plan.members_of_phase(phase, IN_ROW_LOOP)
            if not looped:
                continue
            if self.config.persistent:
                for node in looped:
                    self.emit_member(node)
                continue
            self._emit_loop(looped)

    def _emit_loop(self, members) -> None:
        outer = self.body
        self.loop_prologue, self.loop_epilogue = IndentedBuffer(outer.level), IndentedBuffer(outer.level)
        self.loop_flush = IndentedBuffer(outer.level + 1)
        loop = IndentedBuffer(outer.level + 1)
        loop.writeline("rindex = roffset + rbase")
        if self.need_rmask:
            loop.writeline("rmask = rindex < rnumel")
        self.body = loop
        with self.cse.scope():
            for node in members:
                if self.plan.placement[node.name] == Placement.REDUCTION:
                    self.compute(node)  # results land in the epilogue
                    if node.write_name in self.plan.stored:
                        self.deferred_stores.append(node)
                else:
                    self.emit_member(node)
        self.body = outer
        outer.splice(self.loop_prologue)
        if self.loop_flush.lines:
            # Runs of FLUSH_STEPS blocks, the lane partials moved to float64 after each (_flushes).
            # Nested loops rather than a test in one loop: a branch in the loop body stopped
            # Triton pipelining its loads (a single program's sum over 64M values 28 -> 39 ms).
            run = f"RBLOCK * {FLUSH_STEPS}"
            outer.writeline(f"for rrun in range(0, rnumel, {run}):")
            outer.writeline(f"    for roffset in range(rrun, tl.minimum(rrun + {run}, rnumel), RBLOCK):")
            loop.lines = [("    " + line) if line.strip() else line for line in loop.lines]
            outer.splice(loop)
            outer.splice(self.loop_flush)
        else:
            outer.writeline("for roffset in range(0, rnumel, RBLOCK):")
            outer.splice(loop)
        outer.splice(self.loop_epilogue)
        for node in self.deferred_stores:
            self.store(node, self.node_values[node.name])
        self.deferred_stores = []

    def function_source(self, name: str) -> str:
        """The kernel as a plain @triton.jit function of (..., xnumel, rnumel, pid): a finisher."""
        assert self.program_arg
        self.generate_body()
        return self._function(name).getvalue()

    def source(self, name: str, interpret: bool, comment_lines: list[str]) -> str:
        self.generate_body()
        text = self.module_source([self._function(name).getvalue()], interpret, comment_lines)
        if self.row_split:
            return self.row_split.finish(text)
        return text

    def module_source(self, functions: list[str], interpret: bool, comment_lines: list[str],
                      also: tuple["TritonKernel", ...] = ()) -> str:
        """A kernel module: comments, imports, the helpers the bodies of this kernel and of `also`
        (a combo's other bodies) use, `functions`."""
        out = IndentedBuffer()
        out.writelines(comment_lines)
        out.writeline("import triton")
        out.writeline("import triton.language as tl")
        if interpret:
            out.writeline("from smelt.runtime import interpreter_libdevice as libdevice")
            if any(k.uses_random for k in (self, *also)):
                out.writeline(INTERPRETER_IMPORT)
        else:
            out.writeline("from triton.language.extra import libdevice")
        out.writeline()
        helpers, helper_sources = set(self.helpers), dict(self.helper_sources)
        for other in also:
            helpers |= set(other.helpers)
            helper_sources.update(other.helper_sources)
        if self.finisher is not None:
            helpers |= self.finisher.helpers
            helper_sources.update(self.finisher.helper_sources)
        for helper in sorted(helpers):
            out.writeline()
            for line in COMBINE_HELPERS[helper].splitlines():
                out.writeline(line)
        for source in helper_sources.values():
            out.writeline()
            for line in source.splitlines():
                out.writeline(line)
        if self.finisher is not None:
            for line in self.finisher.function.splitlines():
                out.writeline(line)
        for function in functions:
            for line in function.splitlines():
                out.writeline(line)
        return out.getvalue()

    def launch_args(self) -> tuple[list[tuple[str, str]], list[str]]:
        """(pointer parameter, buffer) pairs and size names, in the order the kernel declares them
        and the wrapper passes them: this kernel's, then its finisher's."""
        pointers, sizes = self.args.call_order(), list(self.args.sizes)
        if self.finisher is not None:
            pointers += self.finisher.params
            sizes += [s for s in self.finisher.sizes if s not in sizes]
        return pointers, sizes

    def _function(self, name: str) -> IndentedBuffer:
        """`@triton.jit def name(...)`: parameters, prologue, body and epilogue."""
        plan = self.plan
        sizes = [str(s) for s in kernel_sizes_symbols(plan)]
        for s in sizes:
            self.args.size(s)
        pointers, size_params = self.launch_args()
        # A host scalar is typed: Triton's JIT, where it launches, would take a Python float as float32.
        host_scalars = set(self.graph.host_scalars.values())
        params = [p for p, _ in pointers] + [f"{p}: tl.float64" if p in host_scalars else p for p in size_params]
        params.append("xnumel")
        if plan.blocks_2d:
            params.append("rnumel")
        consts = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if plan.blocks_2d else [])
        if self.row_split:
            params += ["sync_ptr", "partials_ptr"]
            consts.append("ROW_SPLIT: tl.constexpr")
        if self.finisher is not None:
            params.append("ticket_ptr")
        if self.program_arg:
            params.append("pid")
        out = IndentedBuffer()
        out.writeline()
        out.writeline("@triton.jit")
        out.writeline(f"def {name}({', '.join(params + consts)}):")
        with out.indent():
            if self.config.tiles is not None:
                self._tile_prologue(out)
            else:
                self._rows_prologue(out)
        out.splice(self.body)
        with out.indent():
            if self.row_split:
                self.row_split.epilogue(out)
            if self.finisher is not None:
                self.finisher.epilogue(out)
        return out

    def _rows_prologue(self, out: IndentedBuffer) -> None:
        """This program's x block; a reduction walks r inside it."""
        if self.row_split:
            self.row_split.prologue(out)
        else:
            pid = ("pid" if self.program_arg else "tl.program_id(0)") + \
                (".to(tl.int64)" if self.index_dtype == "tl.int64" else "")
            out.writeline(f"xoffset = {pid} * XBLOCK")
        if self.plan.is_reduction:
            out.writeline("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        else:
            out.writeline("xindex = xoffset + tl.arange(0, XBLOCK)")
        if self.need_xmask:
            out.writeline("xmask = xindex < xnumel")
        if self.plan.is_reduction:
            out.writeline("rbase = tl.arange(0, RBLOCK)[None, :]")

    def _tile_prologue(self, out: IndentedBuffer) -> None:
        """Where this program's tile lies: x blocks along one launch axis, r blocks along the other."""
        pids = tile_program_ids(self.config.tiles, ".to(tl.int64)" if self.index_dtype == "tl.int64" else "")
        for axis, block, shape in (("x", "XBLOCK", "[:, None]"), ("r", "RBLOCK", "[None, :]")):
            out.writeline(f"{axis}offset = {pids[axis]} * {block}")
            out.writeline(f"{axis}index = {axis}offset + tl.arange(0, {block}){shape}")
            if self.need_xmask if axis == "x" else self.need_rmask:
                out.writeline(f"{axis}mask = {axis}index < {axis}numel")


def index_dtype_for(plan: KernelPlan, graph) -> str:
    """int32 index math when every size is static and small enough, int64 otherwise."""
    if graph_needs_int64(graph):
        return "tl.int64"
    v = static_int(plan.xnumel * plan.rnumel)
    return "tl.int64" if v is None or v > INT32_LIMIT else "tl.int32"
