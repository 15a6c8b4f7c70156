"""Scans in Triton: `tl.associative_scan` along r, with the combine printed as a jit function.

With the whole row in registers (persistent) one associative_scan does the row. Otherwise each
block of the r loop is scanned on its own and combined with a carry: the running result up to
the block before, which is the block's last lane afterwards.
"""
from __future__ import annotations

import torch

from ...ir import ScanCombine, use_handler
from ..common import CSE, CSEVar, IndentedBuffer, scan_register_dtype
from .handler import TritonOps, _is_literal
from .ops import cast_text, triton_type

# Combines Triton has itself: its interpreter runs them with numpy rather than element by element.
NATIVE_COMBINES = {"sum": "tl.standard._sum_combine", "prod": "tl.standard._prod_combine"}
# How a looped scan folds the carry into a block when the combine has an identity to start from.
CARRY_UPDATES = {"sum": ("0", "{carry} + {block}"), "prod": ("1", "{carry} * {block}")}


class _FunctionBody:
    """Just enough of a kernel for TritonOps to print a combine's body into a helper function."""

    def __init__(self, interpret: bool):
        self.interpret = interpret
        self.cse = CSE("t")
        self.body = IndentedBuffer(1)
        self.mask_stack: list[str] = []
        self.mask_ranks: dict[str, int] = {}

    def emit(self, expr: str, dtype: torch.dtype, rank: int) -> CSEVar:
        return self.cse.generate(self.body, expr, dtype, rank)

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        return cast_text(value, src, dst, self.interpret)


def combine_function(combine: ScanCombine, dtypes: list[torch.dtype], name: str, interpret: bool) -> str:
    """Source of `@triton.jit def name(a0, .., b0, ..)` returning combine(a, b) for these dtypes."""
    writer = _FunctionBody(interpret)
    a = tuple(CSEVar(f"a{k}", dtype, 2) for k, dtype in enumerate(dtypes))
    b = tuple(CSEVar(f"b{k}", dtype, 2) for k, dtype in enumerate(dtypes))
    handler = TritonOps(writer)
    with use_handler(handler):
        result = combine.fn(a, b)
        result = [handler.to_dtype(v, dtype) for v, dtype in zip(result, dtypes)]
    out = IndentedBuffer()
    out.writeline("@triton.jit")
    out.writeline(f"def {name}({', '.join(v.name for v in a + b)}):")
    out.splice(writer.body)
    with out.indent():
        out.writeline(f"return {', '.join(v.name for v in result)}")
    return out.getvalue()


class ScanEmitter:
    """Prints the scans of one kernel; scans of the same values with the same combine run once."""

    def __init__(self, kernel):
        self.k = kernel
        self.results: dict[tuple, tuple[CSEVar, ...]] = {}
        self.functions: dict[str, str] = {}  # helper source -> its name

    def scan(self, node, values) -> CSEVar:
        data = node.data
        dtypes = [scan_register_dtype(d) for d in data.dtypes]
        ops = self.k.ops()
        blocks = tuple(self._as_block(ops.to_dtype(v, d), dtype) for v, d, dtype in zip(values, data.dtypes, dtypes))
        key = (data.combine, tuple(b.name for b in blocks))
        if key not in self.results:
            function = self._function(data.combine, dtypes)
            if self.k.config.persistent:
                self.results[key] = self._scan_block(blocks, function)
            else:
                self.results[key] = self._scan_looped(data.combine, blocks, function)
        result = self.results[key][data.output_index]
        return ops.to_dtype(result, data.dtype)

    def _as_block(self, value: CSEVar, dtype: torch.dtype) -> CSEVar:
        """value as an [XBLOCK, RBLOCK] tensor of the register type the scan runs in."""
        ttype = triton_type(dtype)
        if value.rank == 0 and _is_literal(value.name):
            return self.k.emit(f"tl.full([XBLOCK, RBLOCK], {value}, {ttype})", dtype, 2)
        # Always broadcast: a value of rank 2 that depends on r alone is still [1, RBLOCK].
        text = f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"
        # Integers always get a cast: an index value is int32 in code whatever its torch dtype says.
        if scan_register_dtype(value.dtype) != dtype or not dtype.is_floating_point:
            text = f"{text}.to({ttype})"
        return self.k.emit(text, dtype, 2)

    def _function(self, combine: ScanCombine, dtypes) -> str:
        if combine.name in NATIVE_COMBINES and len(dtypes) == 1:
            return NATIVE_COMBINES[combine.name]
        name = f"_scan_{combine.name}_combine_{len(self.functions)}"
        source = combine_function(combine, dtypes, name, self.k.interpret)
        key = source.replace(name, "")
        if key not in self.functions:
            self.functions[key] = name
            self.k.helper_sources[name] = source
        return self.functions[key]

    def _fresh(self, stem: str) -> str:
        name = f"{stem}{self.k.cse.counter}"
        self.k.cse.counter += 1
        return name

    def _scan_block(self, blocks, function: str) -> tuple[CSEVar, ...]:
        names = [self._fresh("scan") for _ in blocks]
        operand = blocks[0].name if len(blocks) == 1 else f"({', '.join(b.name for b in blocks)})"
        self.k.body.writeline(f"{', '.join(names)} = tl.associative_scan({operand}, 1, {function})")
        return tuple(CSEVar(n, b.dtype, 2) for n, b in zip(names, blocks))

    def _scan_looped(self, combine: ScanCombine, blocks, function: str) -> tuple[CSEVar, ...]:
        scanned = self._scan_block(blocks, function)
        body, prologue = self.k.body, self.k.loop_prologue
        carries = [self._fresh("carry") for _ in blocks]
        if combine.name in CARRY_UPDATES and len(blocks) == 1:
            start, update = CARRY_UPDATES[combine.name]
            prologue.writeline(f"{carries[0]} = tl.full([XBLOCK, 1], {start}, {triton_type(blocks[0].dtype)})")
            total = self._fresh("scan")
            body.writeline(f"{total} = {update.format(carry=carries[0], block=scanned[0])}")
            results = (CSEVar(total, scanned[0].dtype, 2),)
        else:
            # No identity to start from: the first block keeps its own scan.
            for carry, block in zip(carries, blocks):
                # tl.full, not tl.zeros: the interpreter cannot run Triton's jit library functions.
                prologue.writeline(f"{carry} = tl.full([XBLOCK, 1], 0, {triton_type(block.dtype)})")
            combined = [self._fresh("scan") for _ in blocks]
            body.writeline(f"{', '.join(combined)} = {function}({', '.join(carries)}, "
                           f"{', '.join(s.name for s in scanned)})")
            results = []
            for merged, own in zip(combined, scanned):
                total = self._fresh("scan")
                body.writeline(f"{total} = tl.where(roffset > 0, {merged}, {own})")
                results.append(CSEVar(total, own.dtype, 2))
            results = tuple(results)
        for carry, total in zip(carries, results):
            self._take_last_lane(carry, total)
        return results

    def _take_last_lane(self, carry: str, value: CSEVar) -> None:
        """carry = value[:, RBLOCK - 1], as [XBLOCK, 1]: a sum in which every other lane is zero,
        taken over the bits so that NaN, infinities and -0.0 come through unchanged."""
        dtype = value.dtype
        bits = {torch.float32: "tl.int32", torch.float64: "tl.int64"}.get(dtype)
        lane = self._fresh("last")
        self.k.body.writeline(f"{lane} = tl.where(rbase == RBLOCK - 1, "
                              f"{f'{value}.to({bits}, bitcast=True)' if bits else value}, 0)")
        total = f"tl.reduce({lane}, 1, tl.standard._sum_combine)[:, None]"
        self.k.body.writeline(f"{carry} = {total}.to({triton_type(dtype)}, bitcast=True)" if bits
                              else f"{carry} = {total}")
