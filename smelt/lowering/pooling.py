"""Pooling: max and average pools over fixed windows, adaptive pools, and their backward passes.

Each output element reads a window of its input. A window of at most UNROLL_LIMIT elements is
unrolled into one Pointwise node (a max or a sum over masked loads); a larger window becomes
Reductions over the window's offsets. The backward passes gather instead of scatter:
each input element sums the gradients of the few output windows that can contain it.
"""
from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass

import sympy
import torch

from ..ir import Pointwise, Reduction, StorageBox, TensorBox, ops
from ..runtime import pool_backward  # noqa: F401  (registers smelt::max_pool_backward, smelt::avg_pool_backward)
from ..symbolic import Expr, FloorDiv, contiguous_strides, flat_index, product, static_int, sympify, unflatten_index
from .common import low_precision
from .registry import lowering

aten = torch.ops.aten
log = logging.getLogger("smelt.lowering")

UNROLL_LIMIT = 27  # window elements a Pointwise node reads one by one: up to a 3x3x3 window


def _provable(relation) -> bool:
    return bool(relation == sympy.true)


@dataclass(frozen=True)
class Window:
    """Along one spatial dimension, which input positions output position `o` reads.

    Offset k (in range(length)) reads position start(o) + k * dilation. A fixed window starts at
    o * stride - padding; an adaptive one covers the bin [o * size // out, ceil((o + 1) * size / out)),
    whose length varies with o, so offsets past the bin's end are masked off.
    """
    size: Expr  # input extent
    out: Expr  # output extent
    length: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    adaptive: bool = False

    def start(self, o):
        if self.adaptive:
            return FloorDiv(o * self.size, self.out)
        return o * self.stride - self.padding

    def end(self, o):
        """Exclusive end of an adaptive bin."""
        return FloorDiv((o + 1) * self.size + self.out - 1, self.out)

    def position(self, o, k: int):
        return self.start(o) + k * self.dilation

    def inside(self, o, k: int):
        """An ops bool: offset k of window o lies in the input (None when it always does)."""
        pos = self.position(o, k)
        checks = []
        if self.adaptive:
            if not _provable(sympify(k) < _shortest_bin(self)):
                checks.append(ops.lt(_index(pos), _index(self.end(o))))
            return _all(checks)
        below, past = _may_reach_outside(self, k)
        if below:
            checks.append(ops.ge(_index(pos), ops.constant(0, torch.int64)))
        if past:
            checks.append(ops.lt(_index(pos), _index(self.size)))
        return _all(checks)

    def covering(self, h, need_reach: bool):
        """(o, ops bool or None) for every output window that may read input position h.

        A fixed window spans (length - 1) * dilation + 1 positions, so at most that many // stride
        (+1) windows end at or after h while starting at or before it. With `need_reach` false
        the caller tolerates windows that start before h but end before it too.
        """
        span = (self.length - 1) * self.dilation + 1
        count = (span - 1) // self.stride + 1
        last = FloorDiv(h + self.padding, self.stride)  # the last window starting at or before h
        result = []
        for j in reversed(range(count)):
            o = last - j
            checks = []
            if j > 0:
                checks.append(ops.ge(_index(o), ops.constant(0, torch.int64)))
            highest = (self.size - 1 + self.padding) // self.stride - j
            if not _provable(sympify(highest) < self.out):
                checks.append(ops.lt(_index(o), _index(self.out)))
            # h - start(o) lies in [j * stride, j * stride + stride - 1]: only the farthest
            # candidates can miss h.
            if need_reach and j * self.stride + self.stride - 1 > span - 1:
                checks.append(ops.le(_index(h - self.start(o)), ops.constant(span - 1, torch.int64)))
            result.append((o, _all(checks)))
        return result

    def first_inside(self, o):
        """An ops int64 value: the first position of fixed window o that is not padding."""
        start = _index(self.start(o))
        if self.padding == 0:
            return start
        dilation = ops.constant(self.dilation, torch.int64)
        skipped = ops.floordiv(ops.add(ops.neg(start), ops.constant(self.dilation - 1, torch.int64)), dilation)
        skipped = ops.maximum(skipped, ops.constant(0, torch.int64))
        return ops.add(start, ops.mul(skipped, dilation))

    def count(self, o, include_padding: bool):
        """An ops int64 value: how many positions of window o an average divides by, as eager counts."""
        start = self.start(o)
        if self.adaptive:
            return _index(self.end(o) - start)
        end = start + self.length
        if include_padding:
            limit = self.size + self.padding
            if _provable(sympify((self.out - 1) * self.stride - self.padding + self.length) <= limit):
                return ops.constant(self.length, torch.int64)
            return ops.sub(ops.minimum(_index(end), _index(limit)), _index(start))
        if self.padding == 0 and _provable(sympify((self.out - 1) * self.stride + self.length) <= self.size):
            return ops.constant(self.length, torch.int64)
        zero = ops.constant(0, torch.int64)
        return ops.sub(ops.minimum(_index(end), _index(self.size)), ops.maximum(_index(start), zero))


@functools.lru_cache(maxsize=4096)
def _may_reach_outside(window: Window, k: int) -> tuple[bool, bool]:
    """Whether offset k of some fixed window may lie before the input's start, and past its end.
    Remembered: a window's loop body is traced several times, each asking for every tap."""
    last = (window.out - 1) * window.stride - window.padding + k * window.dilation
    return (not _provable(sympify(k * window.dilation) >= window.padding), not _provable(sympify(last) < window.size))


def _index(expr):
    return ops.index_expr(sympify(expr), torch.int64)


def _all(conditions):
    conditions = [c for c in conditions if c is not None]
    if not conditions:
        return None
    result = conditions[0]
    for c in conditions[1:]:
        result = ops.logical_and(result, c)
    return result


def _bins(size: int, out: int):
    return [(o * size // out, -(-(o + 1) * size // out)) for o in range(out)]


def _shortest_bin(w: Window) -> int:
    return min(end - start for start, end in _bins(int(w.size), int(w.out)))


def _expand(values, n: int, default=None):
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not values:
        values = list(default)
    return values * n if len(values) == 1 else values


def _windows(input_size, out_size, kernel_size, stride, padding, dilation, n: int) -> list[Window]:
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n, default=kernel)
    padding = _expand(padding, n)
    dilation = _expand(dilation, n)
    sizes = input_size[-n:]
    return [Window(s, o, int(k), int(st), int(p), int(d))
            for s, o, k, st, p, d in zip(sizes, out_size[-n:], kernel, stride, padding, dilation)]


def _adaptive_windows(x, out_size, n: int) -> list[Window] | None:
    sizes = [static_int(s) for s in x.get_size()[-n:]]
    outs = [static_int(sympify(o)) for o in out_size[-n:]]
    if None in sizes or None in outs or 0 in outs:
        return None  # bin lengths must be known when the kernel is written
    return [Window(sympify(s), sympify(o), max(e - b for b, e in _bins(s, o)), adaptive=True)
            for s, o in zip(sizes, outs)]


def _lowest(dtype: torch.dtype):
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _window_max(x, windows: list[Window], index):
    """(max value, flat index of it within the input plane) over the window of output `index`.

    As eager: the first maximum wins ties, a NaN wins over any number (a later NaN over an
    earlier one), and a window of only -inf points at its first element inside the input.
    """
    n = len(windows)
    dtype = x.get_dtype()
    lowest = _lowest(dtype)
    load = x.make_loader()
    batch, outs = list(index[:-n]), index[-n:]
    plane = [w.size for w in windows]
    best = best_index = None
    settled = False  # an offset that always lies inside the input has been taken
    for offsets in itertools.product(*(range(w.length) for w in windows)):
        pos = [w.position(o, k) for w, o, k in zip(windows, outs, offsets)]
        inside = _all([w.inside(o, k) for w, o, k in zip(windows, outs, offsets)])
        if inside is None:
            value = load(batch + pos)
        else:
            value = ops.masked(inside, lambda pos=pos: load(batch + pos), lowest)
        flat = _index(flat_index(pos, plane))
        if best is None:  # nothing taken yet: the first offset inside the input is
            best, settled = value, inside is None
            best_index = flat if settled else ops.where(inside, flat, ops.constant(-1, torch.int64))
            continue
        take = ops.gt(value, best)
        if dtype.is_floating_point:
            take = ops.logical_or(take, ops.isnan(value))
        if not settled:
            first = ops.lt(best_index, ops.constant(0, torch.int64))
            take = ops.logical_or(take, first if inside is None else ops.logical_and(inside, first))
            settled = inside is None
        best = ops.where(take, value, best)
        best_index = ops.where(take, flat, best_index)
    return best, best_index


def _max_pool(g, x, windows: list[Window], out_size):
    """(values, indices) of a max pool over the output."""
    if product(w.length for w in windows) > UNROLL_LIMIT:
        return _max_pool_reduction(g, x, windows, out_size)
    dtype = x.get_dtype()
    origins = g.origin | x.origins
    values = Pointwise(x.get_device(), dtype, lambda index: ops.to_dtype(_window_max(x, windows, index)[0], dtype),
                       out_size, origins)
    indices = Pointwise(x.get_device(), torch.int64, lambda index: _window_max(x, windows, index)[1], out_size,
                        origins)
    return TensorBox.of_storage(values), TensorBox.of_storage(indices)


def _max_pool_reduction(g, x, windows: list[Window], out_size):
    """A max pool over a window too large to unroll: reductions over its flattened offsets.

    argmax finds the first maximum, and the first NaN where eager takes the last one, so a second
    argmax over the offsets in reverse finds the last NaN. Masked offsets read -inf, so in a
    window of only -inf argmax may land on padding: eager's first element inside is computed then.
    """
    n = len(windows)
    dtype = x.get_dtype()
    lengths = [sympy.Integer(w.length) for w in windows]
    numel = product(lengths)
    load = x.make_loader()
    lowest = _lowest(dtype)

    def read(index, offset):
        batch, outs = list(index[:-n]), index[-n:]
        ks = unflatten_index(offset, lengths)
        pos = [w.position(o, k) for w, o, k in zip(windows, outs, ks)]
        inside = _all([w.inside(o, k) for w, o, k in zip(windows, outs, ks)])
        return load(batch + pos) if inside is None else ops.masked(inside, lambda: load(batch + pos), lowest)

    def forward(index, rindex):
        return read(index, rindex[0])

    def is_nan_backward(index, rindex):
        return ops.to_dtype(ops.isnan(read(index, numel - 1 - rindex[0])), torch.int32)

    origins = g.origin | x.origins

    def reduce(fn, kind, out_dtype, src_dtype):
        node = Reduction(x.get_device(), out_dtype, fn, out_size, [numel], kind, src_dtype, origins=origins)
        return TensorBox(StorageBox(g.register_computed(node)))
    values = reduce(forward, "max", dtype, dtype)
    first_max = reduce(forward, "argmax", torch.int64, dtype).make_loader()
    if dtype.is_floating_point:
        last_nan = reduce(is_nan_backward, "argmax", torch.int64, torch.int32).make_loader()
        load_value = values.make_loader()

    def flat_position(index):
        offset = first_max(index)
        if dtype.is_floating_point:
            reversed_offset = ops.sub(ops.constant(int(numel) - 1, torch.int64), last_nan(index))
            offset = ops.where(ops.isnan(load_value(index)), reversed_offset, offset)
        ks = unflatten_index(ops.indirect_indexing(offset, numel), lengths)
        plane = [w.size for w in windows]
        found = _index(flat_index([w.position(o, k) for w, o, k in zip(windows, index[-n:], ks)], plane))
        if not any(w.padding for w in windows):
            return found
        first = [w.first_inside(o) for w, o in zip(windows, index[-n:])]
        first_flat = first[-1]
        for pos, stride in zip(first[:-1], contiguous_strides(plane)[:-1]):
            first_flat = ops.add(first_flat, ops.mul(pos, _index(stride)))
        all_lowest = ops.eq(values.make_loader()(index), ops.constant(lowest, dtype))
        return ops.where(all_lowest, first_flat, found)
    indices = Pointwise(x.get_device(), torch.int64, flat_position, out_size, origins)
    return values, TensorBox.of_storage(indices)


def _multi_out_size(g):
    return [sympify(s) for s in g.out_meta[0].shape]


@lowering(aten.max_pool2d_with_indices, aten.max_pool3d_with_indices)
def max_pool_with_indices(g, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = 3 if g.node.target.overloadpacket is aten.max_pool3d_with_indices else 2
    size = _multi_out_size(g)
    return _max_pool(g, x, _windows(x.get_size(), size, kernel_size, stride, padding, dilation, n), size)


@lowering(aten.adaptive_max_pool2d, aten.adaptive_max_pool3d)
def adaptive_max_pool(g, x, output_size):
    n = 3 if g.node.target.overloadpacket is aten.adaptive_max_pool3d else 2
    size = _multi_out_size(g)
    windows = _adaptive_windows(x, size, n)
    if windows is None:
        return NotImplemented
    return _max_pool(g, x, windows, size)


def _window_sum(x, windows: list[Window], batch, outs, offsets_of, acc: torch.dtype):
    load = x.make_loader()
    total = None
    for offsets in offsets_of:
        pos = [w.position(o, k) for w, o, k in zip(windows, outs, offsets)]
        inside = _all([w.inside(o, k) for w, o, k in zip(windows, outs, offsets)])

        def read(pos=pos):
            return ops.to_dtype(load(batch + pos), acc)
        value = read() if inside is None else ops.masked(inside, read, 0)
        total = value if total is None else ops.add(total, value)
    return total


def _divisor(windows: list[Window], outs, count_include_pad: bool, divisor_override, acc):
    if divisor_override:
        return ops.constant(divisor_override, acc)
    counts = [w.count(o, count_include_pad) for w, o in zip(windows, outs)]
    result = counts[0]
    for c in counts[1:]:
        result = ops.mul(result, c)
    return ops.to_dtype(result, acc)


def _avg_pool(g, x, windows: list[Window], out_size, count_include_pad=True, divisor_override=None):
    n = len(windows)
    dtype = x.get_dtype()
    acc = torch.float32 if low_precision(dtype) else dtype
    origins = g.origin | x.origins
    if product(w.length for w in windows) <= UNROLL_LIMIT:
        offsets = list(itertools.product(*(range(w.length) for w in windows)))

        def inner_fn(index):
            batch, outs = list(index[:-n]), index[-n:]
            total = _window_sum(x, windows, batch, outs, offsets, acc)
            return ops.to_dtype(ops.truediv(total, _divisor(windows, outs, count_include_pad, divisor_override, acc)),
                                dtype)
        return TensorBox.of_storage(Pointwise(x.get_device(), dtype, inner_fn, out_size, origins))

    def window_fn(index, rindex):
        batch, outs = list(index[:-n]), index[-n:]
        return _window_sum(x, windows, batch, outs, [list(rindex)], acc)
    reduction = Reduction(x.get_device(), acc, window_fn, out_size,
                          [w.length for w in windows], "sum", acc, origins=origins)
    total = TensorBox(StorageBox(g.register_computed(reduction))).make_loader()

    def divide(index):
        outs = index[-n:]
        return ops.to_dtype(ops.truediv(total(index), _divisor(windows, outs, count_include_pad, divisor_override, acc)),
                            dtype)
    return TensorBox.of_storage(Pointwise(x.get_device(), dtype, divide, out_size, origins))


@lowering(aten.avg_pool2d, aten.avg_pool3d)
def avg_pool(g, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    n = 3 if g.node.target.overloadpacket is aten.avg_pool3d else 2
    size = [sympify(s) for s in g.out_meta.shape]
    return _avg_pool(g, x, _windows(x.get_size(), size, kernel_size, stride, padding, 1, n), size, count_include_pad,
                     divisor_override)


@lowering(aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d)
def adaptive_avg_pool(g, x, output_size):
    n = 3 if g.node.target.overloadpacket is aten._adaptive_avg_pool3d else 2
    size = [sympify(s) for s in g.out_meta.shape]
    windows = _adaptive_windows(x, size, n)
    if windows is None:
        return NotImplemented
    return _avg_pool(g, x, windows, size)


def _gather_backward(g, grad, input_size, windows: list[Window], contribution, need_reach: bool):
    """grad_input over the input's shape: each input element sums `contribution(batch, outs, h)` over the
    output windows that may contain it; `contribution` returns an ops value in the accumulator dtype."""
    n = len(windows)
    dtype = g.out_meta.dtype

    def inner_fn(index):
        batch, hs = list(index[:-n]), index[-n:]
        total = None
        for combo in itertools.product(*(w.covering(h, need_reach) for w, h in zip(windows, hs))):
            outs = [o for o, _ in combo]
            inside = _all([c for _, c in combo])

            def term(outs=outs):
                return contribution(batch, outs, hs)
            value = term() if inside is None else ops.masked(inside, term, 0)
            total = value if total is None else ops.add(total, value)
        return ops.to_dtype(total, dtype)
    origins = g.origin | grad.origins
    return TensorBox.of_storage(Pointwise(grad.get_device(), dtype, inner_fn, input_size, origins))


def _too_many_candidates(g, windows: list[Window]) -> bool:
    count = product(((w.length - 1) * w.dilation) // w.stride + 1 for w in windows)
    if count > UNROLL_LIMIT:
        log.debug("smelt: %s: each input element lies in up to %s windows, too many to unroll; "
                  "it runs through ATen", g.node.target, count)
    return count > UNROLL_LIMIT


@lowering(torch.ops.smelt.max_pool_backward)
def max_pool_backward(g, grad, indices, input_size, kernel_size, stride, padding, dilation, ceil_mode, spatial_dims):
    """The max pool's backward without its input (runtime/pool_backward.py, which decompositions.py
    puts in place of ATen's): each input element sums the gradients of the windows that chose it."""
    n = spatial_dims
    input_size = [sympify(s) for s in input_size]
    windows = _windows(input_size, grad.get_size(), kernel_size, stride, padding, dilation, n)
    if _too_many_candidates(g, windows):
        return NotImplemented
    acc = torch.float32 if low_precision(grad.get_dtype()) else grad.get_dtype()
    load_grad, load_index = grad.make_loader(), indices.make_loader()
    plane = [w.size for w in windows]

    def contribution(batch, outs, hs):
        # A window that does not reach h cannot have chosen it, so no reach check is needed.
        chosen = ops.eq(load_index(batch + outs), _index(flat_index(hs, plane)))
        return ops.where(chosen, ops.to_dtype(load_grad(batch + outs), acc), ops.constant(0, acc))
    return _gather_backward(g, grad, input_size, windows, contribution, need_reach=False)


@lowering(torch.ops.smelt.avg_pool_backward)
def avg_pool_backward(g, grad, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override, spatial_dims):
    """The average pool's backward without its input (runtime/pool_backward.py)."""
    n = spatial_dims
    input_size = [sympify(s) for s in input_size]
    windows = _windows(input_size, grad.get_size(), kernel_size, stride, padding, 1, n)
    if _too_many_candidates(g, windows):
        return NotImplemented
    acc = torch.float32 if low_precision(grad.get_dtype()) else grad.get_dtype()
    load_grad = grad.make_loader()

    def contribution(batch, outs, hs):
        divisor = _divisor(windows, outs, count_include_pad, divisor_override, acc)
        return ops.truediv(ops.to_dtype(load_grad(batch + outs), acc), divisor)
    return _gather_backward(g, grad, input_size, windows, contribution, need_reach=True)
