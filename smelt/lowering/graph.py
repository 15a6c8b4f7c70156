"""Walks an ATen FX graph and builds the IR graph: buffers in program order, inputs, outputs."""
from __future__ import annotations

import contextlib
import logging
import operator
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from ..errors import LoweringError
from ..ir import Buffer, ComputedBuffer, ConstantBuffer, InputBuffer, Layout, Loops, Pointwise, SharedStorage, StorageBox, TensorBox, as_strided_layout, make_contiguous_layout
from ..ir.ops import OpCounter, ReadsHandler, use_handler
from ..ir.views import ReinterpretView
from ..symbolic import index_var, sympify
from . import registry
from .common import layout_of, origin_name
from .extern_calls import fallback
from .kernel_support import why_aten
from .online_softmax import SoftmaxRows
from .traced_layout import realize_as_traced

log = logging.getLogger("smelt.lowering")


@dataclass
class OutputSpec:
    """How the wrapper produces one graph output."""

    kind: str  # "buffer" | "view" | "none" | "scalar"
    name: str | None = None
    layout: Any = None  # for "view": the FixedLayout over buffer `name`
    expr: Any = None  # for "scalar"


class IRGraph:
    """The IR of one FX graph, built in program order by `lower_graph`."""

    def __init__(self, gm: torch.fx.GraphModule, config=None, storage_limit=None, compile_subgraph=None):
        self.gm = gm
        # (gm, example inputs, kind) -> a compiled graph: how a branch of torch.cond is compiled
        # (the pipeline's compile_graph, passed in: the pipeline imports the lowerings).
        self.compile_subgraph = compile_subgraph
        self.config = config  # the settings it is compiled under (which backend takes each device)
        # device type -> the most elements a tensor's storage may hold for a kernel of the backend
        # the settings choose there (None: no limit); the pipeline asks the backend registry.
        self.storage_limit = storage_limit or (lambda device_type: None)
        self.buffers: list[Buffer] = []
        self.inputs: list[tuple[str, Any]] = []  # (placeholder name, InputBuffer | sympy expr | None)
        self.constants: dict[str, ConstantBuffer] = {}
        self.outputs: list[OutputSpec] = []
        self.fallback_ops: list[str] = []
        self.subgraphs: dict[str, object] = {}  # name -> compiled graph called by the wrapper (torch.cond)
        self.random_seeds: dict = {}  # device -> RandomSeeds, made by the first random op on it
        self.node: torch.fx.Node | None = None
        self._counter = 0
        self._dtypes: dict | None = None
        # Writes into graph inputs (aten.copy_), registered after everything else: every other
        # buffer, realized however late, reads an input's old contents, so it must come first.
        self.input_writes: list = []
        # Memory filled slice by slice (a cat's pieces written in place), by name: not steps.
        self.shared_storages: dict[str, SharedStorage] = {}
        self.softmax_rows = SoftmaxRows(gm)  # amax/sum pairs lowered as one online reduction

    # ------------------------------------------------------------ building

    def new_name(self) -> str:
        name = f"buf{self._counter}"
        self._counter += 1
        return name

    @property
    def origin(self) -> frozenset:
        return frozenset([origin_name(self.node)]) if self.node is not None else frozenset()

    @property
    def out_meta(self):
        return self.node.meta.get("val") if self.node is not None else None

    @contextlib.contextmanager
    def lowering_position(self, target, meta, args, kwargs):
        """While one position of a list-returning op (a foreach op) is lowered as the single op
        `target` it stands for, `node` is that op's call: lowerings read its target and eager value."""
        outer = self.node
        self.node = PositionNode(target, {"val": meta}, tuple(args), dict(kwargs), outer)
        try:
            yield
        finally:
            self.node = outer

    def register_computed(self, loops: Loops, layout=None, mutates: str | None = None) -> ComputedBuffer:
        if layout is None:
            layout = make_contiguous_layout(loops.get_device(), loops.get_dtype(), loops.get_size())
        buffer = ComputedBuffer(self.new_name(), layout, loops, mutates=mutates)
        self.buffers.append(buffer)
        return buffer

    def register_shared_storage(self, layout: Layout) -> SharedStorage:
        storage = SharedStorage(self.new_name(), layout)
        self.shared_storages[storage.name] = storage
        return storage

    def register_buffer(self, buffer: Buffer) -> Buffer:
        self.buffers.append(buffer)
        return buffer

    def realize(self, box: TensorBox) -> Buffer | ReinterpretView:
        """A strided form of `box` that can be handed to ATen or returned, copying only if needed."""
        data = box.data if isinstance(box, TensorBox) else box
        if isinstance(data, StorageBox):
            return data.realize(self)
        if isinstance(data, ReinterpretView):
            return data
        strided = as_strided_layout(data)
        if strided is not None:
            buffer, layout = strided
            if layout == buffer.layout:
                return buffer
            return ReinterpretView(buffer, layout)
        return self.register_computed(_copy_loops(data))

    def dtype_of(self, name: str) -> torch.dtype:
        """The element type of a buffer, input or constant by name (storage names included)."""
        if self._dtypes is None:  # built once lowering is over; buffers no longer change then
            self._dtypes = {name: c.get_dtype() for name, c in self.constants.items()}
            self._dtypes.update((n, v.get_dtype()) for n, v in self.inputs if hasattr(v, "layout"))
            self._dtypes.update((n, s.get_dtype()) for n, s in self.shared_storages.items())
            for b in self.buffers:
                if b.layout is not None:
                    self._dtypes.setdefault(getattr(b, "storage_name", b.name), b.get_dtype())
                    self._dtypes[b.name] = b.get_dtype()
        return self._dtypes[name]

    # ------------------------------------------------------------ text

    def describe(self) -> str:
        lines = [f"inputs: {', '.join(n for n, _ in self.inputs)}"]
        for name, c in self.constants.items():
            lines.append(c.describe())
        lines += [s.describe() for s in self.shared_storages.values()]
        lines += [b.describe() for b in self.buffers]
        lines.append("outputs: " + ", ".join(
            o.kind if o.kind == "none" else f"{o.name or o.expr}" + (f" as {o.layout}" if o.layout else "")
            for o in self.outputs))
        return "\n".join(lines)


@dataclass
class PositionNode:
    """A single-tensor op's call standing for one position of a foreach op's FX node `of`."""

    target: Any
    meta: dict
    args: tuple
    kwargs: dict
    of: torch.fx.Node

    def format_node(self) -> str:
        return f"{origin_name(self)} at one position of {self.of.format_node()}"


def _is_symbolic_scalar(val) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def lower_graph(gm: torch.fx.GraphModule, config=None, storage_limit=None, compile_subgraph=None) -> IRGraph:
    graph = IRGraph(gm, config, storage_limit, compile_subgraph)
    env: dict[torch.fx.Node, Any] = {}

    def lookup_env(a):
        return env[a] if isinstance(a, torch.fx.Node) else a

    for node in gm.graph.nodes:
        graph.node = node
        val = node.meta.get("val")
        if node.op == "placeholder":
            env[node] = _lower_placeholder(graph, node, val)
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
        elif node.op == "output":
            (results,) = node.args
            graph.node = None
            returned: dict[str, object] = {}  # storage name -> the FX output that returned it
            for fx_out in results:
                value = env[fx_out] if isinstance(fx_out, torch.fx.Node) else fx_out
                spec = _lower_output(graph, value, fx_out)
                if spec.name is not None and returned.get(spec.name, fx_out) is not fx_out and _fresh_in_eager(fx_out):
                    # Two outputs, one storage, where eager's op made a new tensor (a cat of x and an
                    # empty piece is x itself here): returned as one tensor, autograd took the second
                    # for the first (no grad_fn), and a write to one would show in the other.
                    spec = _lower_output(graph, TensorBox.of_storage(_copy_loops(value)), fx_out)
                if spec.name is not None:
                    returned.setdefault(spec.name, fx_out)
                graph.outputs.append(spec)
            graph.node = None
            for write in graph.input_writes:
                write()
        else:
            raise LoweringError(f"smelt: unsupported FX node kind {node.op!r} ({node.format_node()})")
    return graph


def _lower_placeholder(graph: IRGraph, node, val):
    if isinstance(val, torch.Tensor):
        buffer = InputBuffer(node.name, layout_of(val))
        buffer.storage_offset = sympify(val.storage_offset())
        graph.inputs.append((node.name, buffer))
        return TensorBox.of_storage(buffer)
    if _is_symbolic_scalar(val):
        expr = sympify(val)
        graph.inputs.append((node.name, expr))
        return expr
    graph.inputs.append((node.name, None))
    return val


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
    if _mixes_devices(args, kwargs):
        fn = None  # a kernel reads one device's memory (e.g. CPU indices into a CUDA tensor): ATen moves them
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


def _mixes_devices(args, kwargs) -> bool:
    """Whether the op reads the memory of more than one device. A value computed from inlined
    constants (a CPU scalar tensor in a CUDA graph) reads no memory and goes with any device."""
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
    return len({b.get_device() for b in boxes if _reads_memory(b)}) > 1


def _reads_memory(box: TensorBox) -> bool:
    handler = ReadsHandler()
    with use_handler(handler):
        box.make_loader()([index_var(f"i{k}") for k in range(len(box.get_size()))])
    return bool(handler.reads)


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


def _maybe_realize(graph: IRGraph, node, value):
    """Realize a loop nest read by several users, so that it is computed once and fused, not recomputed."""
    if isinstance(value, TensorBox) and isinstance(value.data, StorageBox) and len(node.users) > 1:
        if isinstance(value.data.data, Loops) and not graph.softmax_rows.keeps_inline(node, value) \
                and not _cheap_scalar(value.data.data):
            value.data.realize(graph)


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


def _fresh_in_eager(fx_out) -> bool:
    target = getattr(fx_out, "target", None)
    return isinstance(target, torch._ops.OpOverload) and not target.is_view


def _copy_loops(value) -> Pointwise:
    """A loop nest computing `value` (a TensorBox or what it holds) element by element."""
    return Pointwise(value.get_device(), value.get_dtype(), value.make_loader(), value.get_size(), value.origins)


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
