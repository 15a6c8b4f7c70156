"""The decomposition table AOTAutograd applies before smelt sees a graph.

PyTorch's core-ATen decompositions, plus composite ops smelt would rather see as their parts
(softmax, layer_norm, ...) so that the parts fuse into one kernel.
"""
import functools

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .runtime import pool_backward  # noqa: F401  (registers smelt::max_pool_backward, smelt::avg_pool_backward)

aten = torch.ops.aten

_EXTRA = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.leaky_relu, aten.elu, aten.hardtanh,
    aten.native_group_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,
    # Composites whose parts smelt lowers, so they fuse instead of running through ATen.
    aten.linalg_vector_norm, aten.i0, aten.addmv, aten.dist,
]

# aten.embedding is not decomposed either (lowering/indexing.py lowers it): as a gather from the
# weight the partitioner would recompute the lookup and save what a layer norm makes of it, in
# float32, where it saves the lookup itself for Inductor (Phi's AMP training peak +7.3 MB, one
# [4096, 1024] bfloat16 activation).

# Core decompositions smelt skips: its own lowerings of these are plain index math, where the
# decompositions build index tensors with arange and read through them.
_LOWERED_INSTEAD = [
    aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d, aten.replication_pad1d,
    aten.replication_pad2d, aten.replication_pad3d, aten.roll,
    # Its decomposition is x * sigmoid(x), which rounds twice: the lowering is eager's x / (1 + exp(-x)).
    aten.silu,
]

# Core decompositions that are wrong for a training graph, so the op stays one ATen call.
# The CPU flash attention's decomposition returns the attention probabilities in the slot where
# the op returns the logsumexp, and its backward op (an ATen call) reads that slot as logsumexp.
_KEPT_AS_ATEN_CALLS = [aten._scaled_dot_product_flash_attention_for_cpu]

# Core decompositions that turn one library product into a slower, larger one: baddbmm's computes a
# bfloat16 or float16 product as a float32 bmm (pw_cast_for_opmath), whose float32 scores doubled
# nn.MultiheadAttention's peak and miss the tensor cores. The library call rounds once, as eager's does.
_PRODUCTS_KEPT = [aten.baddbmm]


@functools.lru_cache(maxsize=None)
def decomposition_table() -> dict:
    """Built once per process; AOTAutograd only reads it."""
    core = core_aten_decompositions()
    # Reading torch's table as a dict first adds the decomposition of every CompositeImplicit op
    # of every other namespace, which AOTAutograd's tracing applies anyway; that costs ~0.1 s.
    table = dict(getattr(core, "decomp_table", None) or core)
    table.update(get_decompositions(_EXTRA))
    for packet in _LOWERED_INSTEAD + _KEPT_AS_ATEN_CALLS + _PRODUCTS_KEPT:
        for name in packet.overloads():
            table.pop(getattr(packet, name), None)
    table[aten._foreach_norm.Scalar] = _foreach_norm
    table[aten.native_group_norm.default] = _native_group_norm
    table[aten.native_group_norm_backward.default] = _native_group_norm_backward
    for op in _STATISTICS_IN_FLOAT64_ON_CPU:
        table[op] = _float64_on_cpu(table[op])
    functional = aten._native_batch_norm_legit_functional.default
    table[functional] = _running_stats_in_float32(table[functional])
    for op, inplace in ((aten.index_add.default, False), (aten.index_add_.default, True)):
        table[op] = _index_add_into_empty(_refusing_negative_index(table[op], _INDEX_ADD_DTYPES), inplace)
    for op in (aten.index_copy.default, aten.index_copy_.default):
        table[op] = _refusing_negative_index(table[op], _INDEX_COPY_DTYPES)
    for op in (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.index_fill_.int_Scalar,
               aten.index_fill_.int_Tensor):
        table[op] = _counting_negative_from_end(table[op])
    for op in (aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default):
        table[op] = functools.partial(_max_pool_backward_without_input, op)
    for op in (aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default):
        table[op] = functools.partial(_avg_pool_backward_without_input, op)
    for op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default):
        if op in table:
            table[op] = _loss_in_opmath(table[op])
    table[aten.smooth_l1_loss_backward.default] = _smooth_l1_loss_backward
    for op in (aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
               aten.scatter_add.default, aten.scatter_reduce.two, aten.index_reduce.default):
        table[op] = functools.partial(_scatter_into_a_scalar_as_one_element, op)
    table[aten.pixel_unshuffle.default] = _pixel_unshuffle_keeping_empty(table[aten.pixel_unshuffle.default])
    table.pop(aten.smooth_l1_loss_backward.grad_input, None)  # torch's calls its own: eager's kernel runs
    return table


def _scatter_into_a_scalar_as_one_element(op, x, dim, index, source, *args, **kwargs):
    """A scatter (or index_reduce) into a 0-d tensor runs on its one-element view: lowered as it
    is, the checked position was no store's index, and Halide checks an index only where it is
    used (a -1 or a 1 wrote the value where eager raises; a review). Any other runs as the op."""
    if x.ndim != 0:
        return NotImplemented
    one = (lambda t: t.reshape(-1) if isinstance(t, torch.Tensor) and t.ndim == 0 else t)
    return op(x.reshape(1), 0, one(index), one(source), *args, **kwargs).reshape(())


def _smooth_l1_loss_backward(grad_output, self, target, reduction: int, beta: float):
    """Eager's kernel: a difference at or past -beta / beta takes -grad / grad, any other grad * x /
    beta, so a NaN difference gets a NaN gradient. torch's decomposition takes sign(x) outside
    |x| < beta, and sign(NaN) is 0 (the fuzzer: a variance over an empty dim fed to the loss)."""
    if beta == 0:  # eager runs l1_loss's backward, sign(x) * grad: torch's decomposition is that
        return torch._decomp.decomposition_table[aten.smooth_l1_loss_backward.default](
            grad_output, self, target, reduction, beta)
    dtype = torch.promote_types(self.dtype, grad_output.dtype)
    opmath = _opmath(dtype)
    norm = 1.0 / self.numel() if reduction == 1 else 1.0  # 1: Reduction.MEAN
    x = (self.to(opmath) - target.to(opmath))
    norm_grad = norm * grad_output.to(opmath)
    inside = norm_grad * x / beta
    return torch.where(x <= -beta, -norm_grad, torch.where(x >= beta, norm_grad, inside)).to(dtype)


def _max_pool_backward_without_input(op, grad, input, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """smelt::max_pool_backward (runtime/pool_backward.py): the backward without the pool's input,
    which the partitioner would otherwise save; a 2-D pool's indices go through their places in
    their windows, which it saves instead (_offsets_in_window)."""
    spatial = 2 if op is aten.max_pool2d_with_indices_backward.default else 3
    if spatial == 2:
        window = (kernel_size, stride, padding, dilation)
        indices = _indices_from_offsets(_offsets_in_window(indices, input.shape[-1], *window), input.shape[-1], *window)
    return torch.ops.smelt.max_pool_backward(grad, indices, list(input.shape), list(kernel_size), list(stride),
                                             list(padding), list(dilation), ceil_mode, spatial)


def _avg_pool_backward_without_input(op, grad, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                     divisor_override):
    """smelt::avg_pool_backward: the backward without the pool's input (a convolution's output
    was saved for its shape alone)."""
    spatial = 2 if op is aten.avg_pool2d_backward.default else 3
    return torch.ops.smelt.avg_pool_backward(grad, list(input.shape), list(kernel_size), list(stride), list(padding),
                                             ceil_mode, count_include_pad, divisor_override, spatial)


def _pool_params(kernel_size, stride, padding, dilation):
    pair = (lambda v: (v, v) if isinstance(v, int) else (tuple(v) * 2 if len(v) == 1 else tuple(v)))
    kernel = pair(kernel_size)
    return kernel, pair(stride) if stride else kernel, pair(padding), pair(dilation)


def _window_origins(indices, stride, padding):
    """Each output position's window's first row and column in the input (before dilation)."""
    rows = torch.arange(indices.shape[-2], device=indices.device) * stride[0] - padding[0]
    cols = torch.arange(indices.shape[-1], device=indices.device) * stride[1] - padding[1]
    return rows.unsqueeze(-1), cols


def _offsets_in_window(indices, width: int, kernel_size, stride, padding, dilation):
    """A 2-D max pool's flat input indices (int64) as each one's place in its window, in int8 when
    the window has at most 127 places: the partitioner then saves the pool's choice for the backward
    in an eighth of the bytes (Inductor saves such offsets too) and the backward recomputes the
    indices (_indices_from_offsets). The index always lies in its window, padding and ceil mode
    included; elsewhere the indices are returned as they are."""
    kernel, stride, padding, dilation = _pool_params(kernel_size, stride, padding, dilation)
    if kernel[0] * kernel[1] > 127:
        return indices
    top, left = _window_origins(indices, stride, padding)
    row, col = torch.div(indices, width, rounding_mode="floor"), torch.remainder(indices, width)
    place = torch.div(row - top, dilation[0], rounding_mode="floor") * kernel[1] + \
        torch.div(col - left, dilation[1], rounding_mode="floor")
    return place.to(torch.int8)


def _indices_from_offsets(offsets, width: int, kernel_size, stride, padding, dilation):
    if offsets.dtype != torch.int8:
        return offsets
    kernel, stride, padding, dilation = _pool_params(kernel_size, stride, padding, dilation)
    top, left = _window_origins(offsets, stride, padding)
    place = offsets.to(torch.int64)
    row = top + torch.div(place, kernel[1], rounding_mode="floor") * dilation[0]
    col = left + torch.remainder(place, kernel[1]) * dilation[1]
    return row * width + col


# The index dtypes eager's kernels take, with their words for any other (torch's decompositions
# check none, and the rewrites below would turn a bool index into rows 0 and 1).
_INDEX_ADD_DTYPES = ((torch.int32, torch.int64), "index_add_(): Expected dtype int32/int64 for index but got: {}")
_INDEX_COPY_DTYPES = ((torch.int64,), "index_copy_(): Expected a long tensor for index, but got {}")
_INDEX_FILL_DTYPES = ((torch.int64,), "index_fill_(): Expected dtype int64 for index.")


def _check_index_dtype(index, accepted) -> None:
    dtypes, message = accepted
    torch._check(index.dtype in dtypes, lambda: message.format(str(index.dtype).removeprefix("torch.")))


def _refusing_negative_index(decomposition, accepted):
    """index_add and index_copy as eager runs them: a negative index is out of bounds. Their
    decompositions are an index_put, which counts it from the end as `x[i]` does, so index_add
    wrote into the last row where eager raises; a negative index becomes the dim's size, which the
    index_put's bounds check refuses."""
    def run(x, dim, index, source, **kwargs):
        _check_index_dtype(index, accepted)
        size = x.shape[dim] if x.ndim else 1
        # A 0-d index names one slice; index_add's decomposition hands it to index_put as it is,
        # whose shapes then disagree with the source's (a review).
        index = index.reshape(-1) if index.ndim == 0 else index
        return decomposition(x, dim, torch.where(index < 0, size, index), source, **kwargs)
    return run


def _counting_negative_from_end(decomposition):
    """index_fill takes a negative index from the end, as `x[i]` does; its decomposition is an
    index_copy, which refuses one (above), so the index is made positive first."""
    def run(x, dim, index, value):
        _check_index_dtype(index, _INDEX_FILL_DTYPES)
        size = x.shape[dim] if x.ndim else 1
        return decomposition(x, dim, torch.where(index < 0, index + size, index), value)
    return run


def _index_add_into_empty(decomposition, inplace: bool):
    """ATen's CPU index_add returns a destination of two or more dims that has no elements as it is,
    without reading the indices (which can then only be out of bounds). The decomposition is an
    index_put, which checks them as eager's index_put does, so its scatter kernel raised 'index out
    of bounds' where eager returns the empty tensor (found by the fuzzer). A 1-D empty destination
    still raises, as in eager. Sizes 0 are never symbolic (Dynamo specializes them), so this is
    decided at trace time; an unbacked size is taken as non-empty, and its scatter checks the
    indices."""
    def run(x, dim, index, source, **kwargs):
        if x.ndim > 1 and guard_or_false(x.numel() == 0):
            return x if inplace else x.clone(memory_format=torch.contiguous_format)
        return decomposition(x, dim, index, source, **kwargs)
    return run


def _pixel_unshuffle_keeping_empty(decomposition):
    """ATen's CPU kernel returns a copy of an input with no elements in the input's own shape
    ((1, 1, 0, 2) by 2 stays (1, 1, 0, 2)); CUDA's (ATen's composite form) and the meta kernel
    reshape it as any other input ((1, 4, 0, 1)), as the decomposition does. Each device gets its
    eager's shape (fuzz seed 4313 on the CPU; the CUDA suite). Sizes 0 are specialized by Dynamo,
    so this is decided at trace time."""
    def run(x, downscale_factor):
        if x.device.type == "cpu" and guard_or_false(x.numel() == 0):
            return x.clone()
        return decomposition(x, downscale_factor)
    return run


# Batch norm's statistics and its backward's sums: ATen's CPU kernels accumulate float32 in
# float64 (acc_type<float> on the CPU), so a float32 reduction over N*H*W loses several times the
# precision eager keeps (resnet50 and efficientnet gradients 2-5x further from float64 than
# eager's). On the CPU these run in float64, as eager's do; CUDA accumulates in float32 like ATen.
# The in-place _native_batch_norm_legit.default is left alone: it updates the running statistics.
_STATISTICS_IN_FLOAT64_ON_CPU = [
    aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.no_stats,
    aten.native_batch_norm_backward.default,
]


def _float64_on_cpu(decomposition):
    def run(*args, **kwargs):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        if first.device.type != "cpu" or first.dtype != torch.float32:
            return decomposition(*args, **kwargs)
        up = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.double() if t.dtype == torch.float32 else t, (args, kwargs))
        out = decomposition(*up[0], **up[1])
        return torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda t: t.float() if t.dtype == torch.float64 else t, out)
    return run


_HALF = (torch.float16, torch.bfloat16)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen's kernels compute a norm in: float32 for half floats."""
    return torch.float32 if dtype in _HALF else dtype


def _running_stats_in_float32(decomposition):
    """Half-float running statistics updated in float32, rounded once, as ATen's batch_norm does.
    torch's decomposition writes momentum * mean + (1 - momentum) * running_mean with the running
    mean in its own dtype, so (1 - momentum) * running_mean is a bfloat16 op that smelt rounds, as
    eager rounds such an op when a user writes it (found by the fuzzer: 4x eager's error)."""
    def run(input, weight, bias, running_mean, running_var, *args, **kwargs):
        if running_mean.dtype not in _HALF and running_var.dtype not in _HALF:
            return decomposition(input, weight, bias, running_mean, running_var, *args, **kwargs)
        out = decomposition(input, weight, bias, running_mean.float(), running_var.float(), *args, **kwargs)
        return (*out[:3], out[3].to(running_mean.dtype), out[4].to(running_var.dtype))
    return run


def _loss_in_opmath(decomposition):
    """A half-float NLL loss computed in float32, its loss and total weight rounded once, as ATen's
    kernels accumulate them. torch's decomposition multiplies by the weights, sums and divides in the
    input's dtype, three roundings that smelt keeps as eager would keep them written out (found by the
    fuzzer on the H200: a weighted bfloat16 mean 0.6719 where eager gives 0.6680 and float64 0.6679)."""
    def run(self, target, weight, *args, **kwargs):
        if self.dtype not in _HALF:
            return decomposition(self, target, weight, *args, **kwargs)
        up = None if weight is None else weight.to(torch.float32)
        output, total_weight = decomposition(self.to(torch.float32), target, up, *args, **kwargs)
        return output.to(self.dtype), total_weight.to(self.dtype)
    return run


def _foreach_norm(tensors, ord=2, dtype=None):
    """clip_grad_norm_'s per-tensor norms, as one reduction each (ATen runs the list as one op, which
    torch does not decompose): the reductions fuse with their reads and share combo launches."""
    return [aten.linalg_vector_norm.default(t, ord, dtype=dtype) for t in tensors]


def _native_group_norm(input, weight, bias, batch_size: int, num_channels: int, inner_size: int,
                       num_groups: int, eps: float):
    """group_norm as (x - mean) * rstd * weight + bias on every device. torch's decomposition
    writes it on the CPU as x * (rstd * weight) + (bias - mean * rstd * weight), ATen's CPU
    formula, whose two products nearly cancel where a group's spread is small against its values:
    a group of one element has variance 0, rstd = 1/sqrt(eps) = 316, and x * 618 = -1311 kept
    one float32 rounding of 6e-5 in a result that should be the bias exactly. ATen rounds once
    less (a fused multiply-add), smelt's kernels do not fuse them, so such programs came out up
    to 2.5x eager's error (found by the fuzzer). The difference from the mean is exact there, and
    where the mean is large against the spread it rounds at the spread's scale, not the mean's."""
    compute = _opmath(input.dtype)
    x = input.to(compute).reshape(batch_size, num_groups, num_channels // num_groups, inner_size)
    var, mean = torch.var_mean(x, dim=[2, 3], correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(input.shape)
    per_channel = [1, num_channels] + [1] * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    stats = (batch_size, num_groups)
    return out.to(input.dtype), mean.reshape(stats).to(input.dtype), rstd.reshape(stats).to(input.dtype)


def _native_group_norm_backward(grad_out, input, mean, rstd, weight, batch_size: int, num_channels: int,
                                inner_size: int, num_groups: int, output_mask):
    """group_norm's backward in its centred form, rstd * (g - mean(g) - xhat * mean(g * xhat)) with
    g = dy * weight and xhat = (x - mean) * rstd. torch's decomposition (ATen's CPU formula) writes
    dx = c1 * dy + c2 * x + c3, whose terms cancel where the gradient is small against them: over a
    group of one element the gradient is 0, eager's kernel cancels it exactly, smelt's fused kernel
    rounds in another order and left 2e-6 (found by the fuzzer). xhat is exactly 0 there."""
    compute = _opmath(input.dtype)
    grouped = (batch_size, num_groups, num_channels // num_groups, inner_size)
    x, dy = input.to(compute).reshape(grouped), grad_out.to(compute).reshape(grouped)
    per_group = (batch_size, num_groups, 1, 1)
    rstd_g = rstd.to(compute).reshape(per_group)
    xhat = (x - mean.to(compute).reshape(per_group)) * rstd_g
    per_channel = (1, num_groups, num_channels // num_groups, 1)
    g = dy * weight.to(compute).reshape(per_channel) if weight is not None else dy
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        centred = g - g.mean(dim=[2, 3], keepdim=True) - xhat * (g * xhat).mean(dim=[2, 3], keepdim=True)
        d_input = (centred * rstd_g).reshape(input.shape).to(input.dtype)
    param_dtype = weight.dtype if weight is not None else input.dtype
    if output_mask[1]:
        d_weight = (dy * xhat).sum(dim=[0, 3]).reshape(num_channels).to(param_dtype)
    if output_mask[2]:
        d_bias = dy.sum(dim=[0, 3]).reshape(num_channels).to(param_dtype)
    return d_input, d_weight, d_bias
