"""A reduction built as two kernels: partial results over chunks of each output's reduced elements
(stage 1), then the reduction of those partials (stage 2). lowering/split_reduction.py decides when.

Stage 1 iterates (outputs, splits) -- (splits, outputs) for a column reduction, so that its
neighbouring lanes read neighbouring columns -- and reduces `chunk` elements per lane;
the last chunk's missing elements are the reduction's identity and are never loaded. Pointwise
producers of x inline into stage 1's body; stage 2 is an ordinary reduction, so its consumers
fuse into its kernel as they would into an unsplit one.
"""
from __future__ import annotations

import torch

from ..ir import Pointwise, Reduction, StorageBox, TensorBox, ops
from ..ir.reduction_kinds import kind, reduction_identity
from ..symbolic import FloorDiv, product, static_int, unflatten_index
from .split_reduction import Split



class _Chunks:
    """Where stage 1's lanes sit in x, and where stage 2 finds their partials."""

    def __init__(self, x: TensorBox, dims: list[int], keepdim: bool, split: Split):
        self.size = x.get_size()
        self.dims = dims
        self.kept = [d for d in range(len(self.size)) if d not in dims]
        self.keepdim = keepdim
        self.split = split
        self.reduced_sizes = [self.size[d] for d in dims]
        self.numel = static_int(product(self.reduced_sizes))
        self.exact = self.numel % split.chunk == 0
        # Flat reduced positions stay below numel + chunk: int32 compares where that fits.
        self.position_dtype = torch.int32 if self.numel + split.chunk < 2 ** 31 else torch.int64

    def partial_ranges(self) -> list:
        outputs = [self.size[d] for d in self.kept]
        return [self.split.splits] + outputs if self.split.columns else outputs + [self.split.splits]

    def partial_index(self, kept_index: list, s) -> list:
        return [s] + list(kept_index) if self.split.columns else list(kept_index) + [s]

    def unpack(self, index: list):
        """(kept index, split) of a stage-1 lane."""
        return (index[1:], index[0]) if self.split.columns else (index[:-1], index[-1])

    def source_index(self, kept_index: list, position) -> list:
        """x's index of reduced element `position` (flat over the reduced dims) of one output."""
        full = [None] * len(self.size)
        for d, i in zip(self.kept, kept_index):
            full[d] = i
        # The outermost reduced dim takes position // (inner sizes) without wrapping around: equal
        # for every real element, and it lets a contiguous x be read at a plain `position`. Past
        # the end it points outside x, but those elements are masked and never loaded.
        inner = self.reduced_sizes[1:]
        outer = FloorDiv(position, product(inner))
        for d, r in zip(self.dims, [outer] + unflatten_index(position, inner)):
            full[d] = r
        return full

    def kept_of_output(self, index: list) -> list:
        """The kept dims' index of a stage-2 output index (which has size-1 dims under keepdim)."""
        return [index[d] for d in self.kept] if self.keepdim else list(index)

    def inside(self, position):
        """Whether a flat reduced position is a real element, not past the end of the last chunk."""
        return ops.lt(ops.index_expr(position, self.position_dtype), ops.constant(self.numel, self.position_dtype))


def make_split_reduction(g, x: TensorBox, dims: list[int], keepdim: bool, out_ranges: list, reduction_type: str,
                         out_dtype: torch.dtype, src_dtype: torch.dtype, outputs: tuple[int, ...],
                         split: Split) -> list[TensorBox]:
    """The two stages of make_reduction's reduction, one TensorBox per index in `outputs`."""
    chunks = _Chunks(x, dims, keepdim, split)
    load = x.make_loader()
    device = x.get_device()

    def chunk_element(index, rindex, fill):
        """Stage 1's value at one lane and reduced position: x's element, or `fill` past the end."""
        kept_index, s = chunks.unpack(index)
        position = s * split.chunk + rindex[0]

        def read():
            value = load(chunks.source_index(kept_index, position))
            return value if x.get_dtype() == src_dtype else ops.to_dtype(value, src_dtype)
        return read() if chunks.exact else ops.masked(chunks.inside(position), read, fill)

    def stage1(rtype, dtype, inner_fn, output_index=0):
        node = Reduction(device, dtype, inner_fn, chunks.partial_ranges(), [split.chunk], rtype, src_dtype,
                         output_index, origins=g.origin | x.origins)
        return g.register_computed(node)

    def stage2(rtype, dtype, inner_fn, partial_dtype, output_index=0):
        node = Reduction(device, dtype, inner_fn, out_ranges, [split.splits], rtype, partial_dtype, output_index,
                         origins=g.origin)
        return TensorBox(StorageBox(g.register_computed(node)))

    def partial_reader(buffer):
        load_partial = buffer.make_loader()
        return lambda index, rindex: load_partial(chunks.partial_index(chunks.kept_of_output(index), rindex[0]))

    if kind(reduction_type).same_kind_stages:
        fill = reduction_identity(reduction_type, src_dtype)
        partials = stage1(reduction_type, out_dtype, lambda i, r: chunk_element(i, r, fill))
        return [stage2(reduction_type, out_dtype, partial_reader(partials), out_dtype)]
    if reduction_type in ("argmax", "argmin"):
        return [_split_arg_reduction(g, chunks, reduction_type, src_dtype, chunk_element, stage1, stage2,
                                     partial_reader, out_ranges, device)]
    if reduction_type == "welford_reduce":
        return _split_welford(chunks, out_dtype, outputs, chunk_element, stage1, stage2, partial_reader)
    raise AssertionError(f"smelt: no two-stage form for reduction {reduction_type}")


def _split_arg_reduction(g, chunks, reduction_type, src_dtype, chunk_element, stage1, stage2, partial_reader,
                         out_ranges, device) -> TensorBox:
    """argmax/argmin: stage 1 keeps each chunk's extreme value and its index in the chunk; stage 2
    picks the chunk whose value wins (the first among equals, as eager's first index is in the
    earliest chunk) and reads that chunk's index."""
    fill = reduction_identity(reduction_type, src_dtype)

    def element(index, rindex):  # one body: the two reductions share its loads
        return chunk_element(index, rindex, fill)

    values = stage1(reduction_type[3:], src_dtype, element)
    positions = stage1(reduction_type, torch.int64, element)
    winner = stage2(reduction_type, torch.int64, partial_reader(values), src_dtype)
    load_winner, load_position = winner.make_loader(), positions.make_loader()
    split = chunks.split

    def index_in_row(index):
        s = load_winner(index)
        local = load_position(chunks.partial_index(chunks.kept_of_output(index),
                                                   ops.indirect_indexing(s, split.splits)))
        return ops.add(local, ops.mul(s, ops.constant(split.chunk, torch.int64)))
    return TensorBox.of_storage(Pointwise(device, torch.int64, index_in_row, out_ranges, g.origin))


def _split_welford(chunks, acc_dtype, outputs, chunk_element, stage1, stage2, partial_reader) -> list[TensorBox]:
    """Welford: stage 1 yields each chunk's (mean, m2); its count is known from the sizes. Stage 2
    merges the partials with welford_combine."""
    split = chunks.split
    if chunks.exact:
        kind, element = "welford_reduce", (lambda i, r: chunk_element(i, r, 0))
    else:
        # Elements past the end must not count: each element enters as a one-element partial
        # (value, 0, 1), a missing one as the empty partial (0, 0, 0).
        def element(index, rindex):
            _, s = chunks.unpack(index)
            real = ops.to_dtype(chunks.inside(s * split.chunk + rindex[0]), acc_dtype)
            return chunk_element(index, rindex, 0), ops.constant(0.0, acc_dtype), real
        kind = "welford_combine"
    mean, m2 = (stage1(kind, acc_dtype, element, k) for k in (0, 1))
    read_mean, read_m2 = partial_reader(mean), partial_reader(m2)

    def partial(index, rindex):
        if chunks.exact:
            count = ops.constant(float(split.chunk), acc_dtype)
        else:
            last = ops.eq(ops.index_expr(rindex[0], torch.int32), ops.constant(split.splits - 1, torch.int32))
            count = ops.where(last, ops.constant(float(split.tail(chunks.numel)), acc_dtype),
                              ops.constant(float(split.chunk), acc_dtype))
        return read_mean(index, rindex), read_m2(index, rindex), count
    return [stage2("welford_combine", acc_dtype, partial, acc_dtype, k) for k in outputs]

