"""Walks an ATen FX graph and builds the IR graph: buffers in program order, inputs, outputs."""
from __future__ import annotations

import logging
import operator
from typing import Any

import sympy
import torch
import torch.fx

from ..errors import LoweringError
from ..ir import ComputedBuffer, ConstantBuffer, InputBuffer, Loops, Pointwise, StorageBox, TensorBox
from ..ir.graph import IRGraph, OutputSpec, copy_loops, origin_name
from ..ir.ops import OpCounter, ReadsHandler, is_indirect, use_handler
from ..ir.views import ReinterpretView, View
from ..symbolic import index_var, product, sympify
from . import registry
from .common import layout_of
from .extern_calls import extern_call, fallback
from .input_writes import run_input_writes
from .kernel_support import why_aten
from .online_softmax import SoftmaxRows
from .traced_layout import realize_as_traced, realize_in_traced_order, realize_view_base, view_base_node

log = logging.getLogger("smelt.lowering")


def _is_symbolic_scalar(val) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def lower_graph(gm: torch.fx.GraphModule, config=None, target_for=None, compile_subgraph=None) -> IRGraph:
    graph = IRGraph(gm, config, target_for, compile_subgraph)
    graph.softmax_rows = SoftmaxRows(gm)
    env: dict[torch.fx.Node, Any] = {}
    distances = ReaderDistances(gm)

    def lookup_env(a):
        return env[a] if isinstance(a, torch.fx.Node) else a

    gpu = _gpu_of_inputs(gm)
    for node in gm.graph.nodes:
        graph.node = node
        val = node.meta.get("val")
        if node.op == "placeholder":
            env[node] = _lower_placeholder(graph, node, val, gpu)
        elif node.op == "get_attr":
            env[node] = _lower_constant(graph, node)
        elif node.op == "call_function":
            if _is_symbolic_scalar(val) and node.target is not torch.ops.aten._local_scalar_dense.default:
                env[node] = sympify(val)  # size arithmetic: the meta value already is the expression
                continue
            args = torch.fx.node.map_aggregate(node.args, lookup_env)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, lookup_env)
            env[node] = _lower_call(graph, node, args, kwargs)
            _maybe_realize(graph, node, env[node])
            _realize_output_in_place(graph, node, env[node])
            _realize_before_a_distant_reader(graph, node, env, distances)
        elif node.op == "output":
            (results,) = node.args
            graph.node = None
            returned: dict[str, object] = {}  # storage name -> the FX output that returned it
            # Storages the caller owns: the graph's inputs and the constants it holds.
            callers = {name for name, _ in graph.inputs} | set(graph.constants)
            for fx_out in results:
                value = env[fx_out] if isinstance(fx_out, torch.fx.Node) else fx_out
                spec = _lower_output(graph, value, fx_out)
                if spec.name is not None and (
                        returned.get(spec.name, fx_out) is not fx_out and _fresh_in_eager(fx_out)
                        or spec.name in callers and _made_in_eager(fx_out)):
                    # An output in another's storage, or in an input's or constant's, where eager's
                    # op made a new tensor (a cat of x and an empty piece is x itself here): a write
                    # to one would show in the other (an input written in place by the graph after
                    # the cat showed in the cat's result), and autograd took the second of two
                    # outputs for the first (no grad_fn). A view of it returned too gets a copy of its
                    # own, no longer its view: lowerings should not alias (cat's no longer does), and
                    # the fuzzer's check of shared memory reports one that does.
                    log.debug("smelt: output %s copied: eager's op makes it anew, here it lay in %s's memory",
                              fx_out, spec.name)
                    spec = _lower_output(graph, TensorBox.of_storage(copy_loops(value)), fx_out)
                if spec.name is not None:
                    returned.setdefault(spec.name, fx_out)
                graph.outputs.append(spec)
            graph.node = None
            run_input_writes(graph, graph.input_writes)
        else:
            raise LoweringError(f"smelt: unsupported FX node kind {node.op!r} ({node.format_node()})")
    return graph


def _lower_placeholder(graph: IRGraph, node, val, gpu: str | None):
    if isinstance(val, torch.Tensor):
        buffer = InputBuffer(node.name, layout_of(val))
        buffer.storage_offset = sympify(val.storage_offset())
        graph.inputs.append((node.name, buffer))
        if _is_host_scalar(graph, val, gpu):
            graph.host_scalars[node.name] = f"{node.name}_value"
        return TensorBox.of_storage(buffer)
    if _is_symbolic_scalar(val):
        expr = sympify(val)
        graph.inputs.append((node.name, expr))
        return expr
    graph.inputs.append((node.name, None))
    return val


def _is_host_scalar(graph: IRGraph, val: torch.Tensor, gpu: str | None) -> bool:
    """Whether a graph input is a CPU float scalar that the kernels of the graph's GPU (device type
    `gpu`) take by value (Target.host_scalar_args). A CPU graph's kernels read it from memory like
    any input: a combo launch takes only the scalars all its members read, so a value argument
    would give each parameter of an Adam step its own launch (their CPU step counts differ).
    SMELT_HOST_SCALAR_ARGS=on takes them by value there too; off, nowhere."""
    if val.dim() != 0 or val.device.type != "cpu" or val.dtype not in (torch.float32, torch.float64):
        return False
    setting = graph.config.host_scalar_args if graph.config is not None else "auto"
    if setting == "off" or (gpu is None and setting != "on"):
        return False
    return graph.target_for(gpu or "cpu").host_scalar_args


def _gpu_of_inputs(gm) -> str | None:
    """The device type of the graph's non-CPU tensor inputs (the first in sorted order), if any."""
    devices = {n.meta["val"].device.type for n in gm.graph.nodes
               if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
    return next((d for d in sorted(devices) if d != "cpu"), None)


def _lower_constant(graph: IRGraph, node):
    value = getattr(graph.gm, node.target)
    if not isinstance(value, torch.Tensor):
        return value
    buffer = ConstantBuffer(node.name, layout_of(value), value)
    graph.constants[node.name] = buffer
    return TensorBox.of_storage(buffer)


def _lower_call(graph: IRGraph, node, args, kwargs):
    target = node.target
    if target is operator.getitem:
        return args[0][args[1]]
    fn = registry.lookup(target)
    why = why_aten(graph, node) if isinstance(target, torch._ops.OpOverload) else None
    if why is not None and not getattr(fn, "runs_aten_itself", False):
        # No kernel computes it (float8, complex, a tensor past Halide's extents...): ATen does, as eager would.
        log.debug("smelt: %s runs through its ATen kernel: %s", origin_name(node), why)
        fn = None
    if _mixes_devices(graph, args, kwargs):
        fn = None  # a kernel reads one device's memory (e.g. CPU indices into a CUDA tensor): ATen moves them
    if fn is not None and _reads_a_symbolic_float(args, kwargs):
        # Kernels take symbolic sizes as integers; the wrapper computes a SymFloat as a Python float.
        log.debug("smelt: %s runs through its ATen kernel: it reads a symbolic float", origin_name(node))
        fn = None
    try:
        if fn is not None:
            result = fn(graph, *args, **kwargs)
            if result is not NotImplemented:
                _check_shape(node, result)
                if not _on_eagers_device(node, result):
                    # Built on another device than eager's result (a CPU scalar operand taken for
                    # the op's device): ATen places it right.
                    log.debug("smelt: %s runs through its ATen kernel: its lowering built it on %s, eager on %s",
                              origin_name(node), result.get_device(), node.meta["val"].device)
                    return fallback_call(graph, target, args, kwargs)
                return result
        return fallback_call(graph, target, args, kwargs)
    except LoweringError:
        raise
    except Exception as e:
        raise LoweringError(f"smelt: lowering {origin_name(node)} failed for `{node.format_node()}` "
                            f"with inputs {_describe_inputs(node)}: {type(e).__name__}: {e}") from e


def _reads_a_symbolic_float(args, kwargs) -> bool:
    """Whether an argument is a non-integer symbolic scalar (a SymFloat: n / (n - 1) of a symbolic n)."""
    return any(isinstance(a, sympy.Expr) and a.free_symbols and not a.is_integer
               for a in torch.utils._pytree.tree_leaves((args, kwargs)))


def _mixes_devices(graph: IRGraph, args, kwargs) -> bool:
    """Whether the op reads the memory of more than one device. A value computed from inlined
    constants or host scalar inputs (a CPU scalar tensor in a CUDA graph) reads no memory and goes
    with any device."""
    boxes = []

    def visit(a):
        if isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, TensorBox):
            boxes.append(a)
    visit(args)
    visit(tuple(kwargs.values()))
    if len({b.get_device() for b in boxes}) < 2:
        return False  # the common case: no body needs tracing
    # Host scalars are arguments of GPU kernels only: a CPU result (a copy of a GPU value into a
    # 0-d CPU input) would be a CPU kernel reading GPU memory.
    on_gpu = any(isinstance(v, torch.Tensor) and v.device.type != "cpu"
                 for v in torch.utils._pytree.tree_leaves(graph.node.meta.get("val")))
    return len({b.get_device() for b in boxes if _loads_a_buffer(graph, b, on_gpu)}) > 1


def _loads_a_buffer(graph: IRGraph, box: TensorBox, host_scalars_as_values: bool) -> bool:
    """Whether the box's values read memory (a GPU kernel reads a host scalar input as a value)."""
    handler = ReadsHandler()
    with use_handler(handler):
        box.make_loader()([index_var(f"i{k}") for k in range(len(box.get_size()))])
    return any(not (host_scalars_as_values and name in graph.host_scalars) for name, _ in handler.reads)


def _describe_inputs(node) -> str:
    parts = []
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        parts.append(f"{a.name}: {getattr(v, 'dtype', '')}{list(v.shape) if isinstance(v, torch.Tensor) else v}")
    return "[" + ", ".join(parts) + "]"


def fallback_call(graph: IRGraph, target, args, kwargs):
    return fallback(graph, target, args, kwargs)


def _on_eagers_device(node, result) -> bool:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and isinstance(result, TensorBox):
        return result.get_device() == val.device
    return True


def _check_shape(node, result):
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and isinstance(result, TensorBox):
        want = [sympify(s) for s in val.shape]
        got = result.get_size()
        if len(want) != len(got) or any(sympy.expand(a - b) != 0 for a, b in zip(want, got)):
            raise LoweringError(f"smelt: lowering of {origin_name(node)} built shape {got}, "
                                f"eager gives {want} (`{node.format_node()}`)")
        if result.get_dtype() != val.dtype:
            raise LoweringError(f"smelt: lowering of {origin_name(node)} built dtype {result.get_dtype()}, "
                                f"eager gives {val.dtype}")


# Ops a one-element value may take and still be recomputed by each reader instead of stored.
SCALAR_INLINE_OPS = 12


# Ops that read only their input's size, dtype and device, never its elements.
_METADATA_READERS = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("full_like", "empty_like", "zeros_like", "ones_like", "new_empty", "new_zeros", "new_ones",
                 "new_full", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"))


def _maybe_realize(graph: IRGraph, node, value):
    """Realize a loop nest several nodes read (directly or through views), so that it is computed
    once and fused, not recomputed; unless recomputing it costs less (a softmax row step, a
    one-element value, one `_cheaper_recomputed` accepts) and at most one ATen call reads it, which
    then stays a loop nest for good. A view read several times may realize its base
    (`_realize_read_views_base`). A reader of its size alone (a cross-entropy backward's
    full_like(log_probs)) does not count."""
    # Readers are counted through views: a value whose one user is a view read by several (OPT's
    # residual stream, `view(h, [-1, d])` read by the next norm and the next residual add) was never
    # judged, and each layer's norm recomputed the sum of every layer before it.
    readers = [reader for reader in _readers_through_views(node)
               if getattr(reader.target, "overloadpacket", None) not in _METADATA_READERS]
    if not isinstance(value, TensorBox) or len(readers) <= 1:
        return
    if isinstance(value.data, StorageBox):
        loops = value.data.data
        if not isinstance(loops, Loops):
            return
        # Each ATen call reading a value its readers recompute gets a copy of its own (a padded
        # gradient's two products: BERT's logits gradient twice over): stored once instead.
        stored = sum(_reads_memory(reader) for reader in readers)
        # (A value recomputed by a reader far later holds what it reads alive until then: no more
        # bytes than it would store, by `_cheaper_recomputed`'s byte rule; a softmax row step reads
        # one input of its size. `_realize_before_a_distant_reader` covers one reader.)
        # A value stored for one ATen call anyway is read back by its other readers unless recomputing
        # it loads fewer bytes: otherwise the bytes are the same, and what it is computed from is not
        # held alive for them (nn.MultiheadAttention's head-averaged weights recomputed the softmax
        # and kept the scores to their end: +16 MiB at its peak).
        if stored == 0:
            recompute = (graph.softmax_rows.keeps_inline(node, value) or _cheap_scalar(loops)
                         or _cheaper_recomputed(graph, loops, readers))
        else:
            recompute = stored == 1 and (_cheap_scalar(loops) or _cheaper_recomputed(graph, loops, readers, strictly=True))
        if recompute:
            value.data.keep_recomputed()  # its readers recompute it; a later op asking for memory gets a copy
        else:
            realize_in_traced_order(graph, value.data, node)
        return
    _realize_read_views_base(graph, node, value)


# Arithmetic ops a value read by several kernels may take and still be recomputed by each of them.
RECOMPUTE_MAX_OPS = 12


def recomputes_dtype(dtype: torch.dtype) -> bool:
    """Index arithmetic stays stored: its readers use it as addresses, which the byte count of
    `_cheaper_recomputed` does not see. (Not for correctness: T5's buckets, recomputed, came out wrong
    only while the view rule realized recomputed bases; tests/test_fusion.py lifts this rule.)"""
    return dtype.is_floating_point


def _cheaper_recomputed(graph: IRGraph, loops: Loops, readers: list, strictly: bool = False) -> bool:
    """Whether each reader recomputing a pointwise value moves fewer bytes than storing it once and
    reading it back: it loads no more bytes per element, at full size, than it would store (a
    norm backward's float32 sum of two bfloat16 gradients, which a separate weight-gradient
    column sum read back: 16 MB written and read per Qwen2 norm), in a few ops, and no reader
    broadcasts it (each would recompute every element many times). Readers fused into one kernel
    compute it once either way. `readers`: the nodes reading it, through views; `strictly`: fewer
    bytes, not as few (a value stored for an ATen call anyway)."""
    if type(loops) is not Pointwise or any(reader.op == "output" for reader in readers):
        return False  # the output stores it anyway
    if not recomputes_dtype(loops.get_dtype()):
        return False
    size = loops.get_size()
    if any(_spans_more_than(reader, product(size)) for reader in readers):
        return False
    reads = ReadsHandler()
    index = loops.index_vars()
    try:
        with use_handler(reads):
            loops.inner_fn(index)
    except AttributeError:
        return False  # an op the handler does not know (random numbers): computed once
    # Arithmetic, each value once as a kernel computes it; loads are priced by bytes below. (A
    # ViT's last norm gradient takes 9 ops and 6 loads; stored, it held 18 MiB at the peak.)
    if reads.distinct_ops - len(set(reads.reads)) > RECOMPUTE_MAX_OPS:
        return False
    varying = {v for v, n in zip(index, size) if sympify(n) != 1}
    full = set()
    for name, at in reads.reads:
        symbols = sympify(at).free_symbols
        # A gather (an embedding row) loads an element for each one it computes, whatever its index shows.
        if varying <= symbols or any(is_indirect(s) for s in symbols):
            full.add(name)
    try:
        loaded = sum(graph.dtype_of(name).itemsize for name in full)
    except KeyError:
        return False
    return loaded < loops.get_dtype().itemsize if strictly else loaded <= loops.get_dtype().itemsize


def _realize_read_views_base(graph: IRGraph, node, value: TensorBox):
    """A view read several times, each reader broadcasting it over more elements than its base has,
    realizes the base: rotary embeddings read `cos(emb).unsqueeze(1)` in every layer (one view node
    after the partitioner's CSE) across batch and heads, and each layer's kernel recomputed the
    cosine 128 times per position (Qwen2's training: 125 us per layer where the loads take 15).
    Readers of the base's own size recompute it instead: storing float32 logits read by a log
    softmax's two passes would write 500 MB to save a cast."""
    data = value.data
    while isinstance(data, View):
        data = data.data
    if not isinstance(data, StorageBox) or data.is_realized() or not isinstance(data.data, Loops):
        return
    if data.recomputed or _cheap_scalar(data.data):
        return  # left to its readers (realizing it now could reorder the earlier ones' reads)
    base_numel = product(data.data.get_size())
    if not any(_spans_more_than(user, base_numel) for user in node.users):
        return
    realize_view_base(graph, value, node)


def _readers_through_views(node) -> list:
    """The nodes that read `node`'s elements: its users, and for a user that is a view, that
    view's readers."""
    readers = []
    for user in node.users:
        if isinstance(user.target, torch._ops.OpOverload) and user.target.is_view:
            readers += _readers_through_views(user)
        else:
            readers.append(user)
    return readers


def _reads_memory(node) -> bool:
    """Whether `node` runs through ATen (a matrix product, a convolution, an op smelt does not lower),
    which reads its inputs from memory: a value its readers recompute is stored for it."""
    if node.op != "call_function":
        return True
    fn = registry.lookup(node.target)
    return fn is None or fn is extern_call


def _spans_more_than(node, numel) -> bool:
    """Whether a node's value or one of its tensor inputs has more than `numel` elements: its loop
    runs over more elements than a value of `numel` has, so it reads that value broadcast. Where
    symbolic sizes leave it open (Qwen2's rotary table of s * 64 against s * 1792 under
    dynamic=True), the sizes traced decide."""
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for v in values:
        if not isinstance(v, torch.Tensor):
            continue
        more = sympy.expand(sympify(v.numel()) - numel)
        if more.is_positive is True:
            return True
        if more.free_symbols and _at_traced_sizes(values, more) > 0:
            return True
    return False


def _at_traced_sizes(values, expr) -> float:
    """expr's value at the sizes the graph was traced with (-1 where no shape environment says)."""
    for v in values:
        count = v.numel() if isinstance(v, torch.Tensor) else None
        if isinstance(count, torch.SymInt):
            env = count.node.shape_env
            known = getattr(env, "backed_var_to_val", None)  # torch 2.11+; var_to_val warns there
            traced = expr.xreplace(env.var_to_val if known is None else known)
            return float(traced) if traced.is_number else -1.0
    return -1.0


class ReaderDistances:
    """Positions in an FX graph, and how many ATen calls (each allocating its result) run between two
    of them."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.position, self._aten_before, count = {}, [], 0
        for k, node in enumerate(gm.graph.nodes):
            self.position[node] = k
            self._aten_before.append(count)
            count += node.op == "call_function" and _reads_memory(node)

    def aten_calls_between(self, first, last) -> int:
        """ATen calls strictly after `first` and before `last`."""
        a, b = self.position[first] + 1, self.position[last]
        return self._aten_before[b] - self._aten_before[a] if b > a else 0


def _lazy(value) -> bool:
    data = getattr(value, "data", None)
    while isinstance(data, View):
        data = data.data
    return isinstance(data, StorageBox) and isinstance(data.data, Loops) and not data.is_realized()


def _realize_before_a_distant_reader(graph: IRGraph, node, env, distances: ReaderDistances):
    """A pointwise value its one reader reads only after other ATen calls is stored where the program
    computes it when that frees more than it holds: left lazy, it keeps every buffer it reads alive
    until then. A weight shared by several layers (ALBERT) gets its gradient summed one layer at a
    time, each sum read by the next layer's, far later: lazy, the whole sum waited for the last
    layer, holding every layer's [768, 3072] product (CPU training peak 1.45x Inductor's)."""
    value = env[node]
    if not isinstance(value, TensorBox) or not isinstance(value.data, StorageBox) or value.data.is_realized() \
            or type(value.data.data) is not Pointwise:
        return
    readers = _readers_through_views(node)
    if len(readers) != 1 or readers[0].op == "output" or not distances.aten_calls_between(node, readers[0]):
        return
    meta = node.meta.get("val")
    if not isinstance(meta, torch.Tensor):
        return
    numel = sympify(meta.numel())
    here = distances.position[node]
    leaves, stack, seen = set(), list(node.all_input_nodes), set()
    while stack:  # the buffers the lazy value reads: through lazy inputs down to stored ones
        a = stack.pop()
        if a in seen or a not in env:
            continue
        seen.add(a)
        if _lazy(env[a]):
            stack += a.all_input_nodes
        else:
            leaves.add(view_base_node(a))
    dying = 0
    for leaf in leaves:
        if leaf.op == "get_attr" or (leaf.op == "placeholder" and leaf.name not in graph.donated_inputs):
            continue  # the caller's memory: freed by no node of this graph
        v = leaf.meta.get("val")
        if not isinstance(v, torch.Tensor) or sympy.expand(sympify(v.numel()) - numel) != 0:
            continue  # a broadcast value or a scalar: not what it holds alive
        if all(distances.position[r] <= here for r in _readers_through_views(leaf)):
            dying += sympify(v.numel()) * v.dtype.itemsize
    if sympy.expand(dying - numel * meta.dtype.itemsize).is_positive is True:
        realize_as_traced(graph, value, node)


def _realize_output_in_place(graph: IRGraph, node, value):
    """A value only the graph's output reads is computed where the program computes it, not after
    the last op: left lazy, every output of a backward (each weight gradient's float32 cast, each
    norm weight's column sum) waited for the end, holding all the inputs they read alive until then
    (Qwen2's AMP training: every bfloat16 weight gradient and 17 float32 activation gradients)."""
    if not isinstance(value, TensorBox) or not node.users:
        return
    if any(user.op != "output" for user in node.users):
        return
    data = value.data
    while not isinstance(data, StorageBox) and hasattr(data, "data"):
        data = data.data  # a view of a lazy value: its base is realized, as the output would do
    if isinstance(data, StorageBox) and isinstance(data.data, Loops) and not data.is_realized():
        realize_as_traced(graph, value, node)


def _cheap_scalar(loops: Loops) -> bool:
    """Whether a loop nest is one element computed by a few ops (an optimizer's bias correction, a
    constant): each reader recomputes it once per program, which costs less than a kernel, a
    buffer and a load. A for-loop Adam stored three such values per parameter."""
    if not isinstance(loops, Pointwise) or any(sympify(r) != 1 for r in loops.get_size()):
        return False
    handler = OpCounter()
    try:
        with use_handler(handler):
            loops.make_loader()([sympify(0)] * len(loops.get_size()))
    except AttributeError:
        return False  # an op the counter does not know (random numbers): computed once
    return handler.ops <= SCALAR_INLINE_OPS


def _returns_an_argument(target) -> bool:
    """A view (`view`, `t`) or an in-place op (`copy_`, `add_`): its result is memory of its first
    argument, in eager."""
    return any(r.alias_info is not None for r in target._schema.returns)


def _fresh_in_eager(fx_out) -> bool:
    target = getattr(fx_out, "target", None)
    return isinstance(target, torch._ops.OpOverload) and not _returns_an_argument(target)


def _made_in_eager(fx_out) -> bool:
    """Whether eager's value lies in memory an op made anew (the op's, or that of the base its
    views start from), not in an input's or a constant's."""
    while isinstance(fx_out, torch.fx.Node):
        target = fx_out.target
        if not isinstance(target, torch._ops.OpOverload):
            return False  # an input, a constant, an element of a tuple
        if not _returns_an_argument(target):
            return True
        fx_out = fx_out.args[0] if fx_out.args else None
    return False


def _lower_output(graph: IRGraph, value, fx_out) -> OutputSpec:
    if value is None:
        return OutputSpec("none")
    if isinstance(value, sympy.Expr) or isinstance(value, (int, float, bool)):
        return OutputSpec("scalar", expr=sympify(value) if not isinstance(value, float) else value)
    assert isinstance(value, TensorBox), value
    strided = realize_as_traced(graph, value, fx_out)
    if isinstance(strided, ReinterpretView):
        return OutputSpec("view", name=strided.name, layout=strided.layout)
    name = strided.storage_name if isinstance(strided, ComputedBuffer) else strided.name
    return OutputSpec("buffer", name=name)
