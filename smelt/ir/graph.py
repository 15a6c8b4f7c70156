"""The IR of one FX graph: its buffers in program order, inputs, constants and outputs, as the
lowering builds it and the scheduler and code generators read it."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from ..target import H100, Target
from .loops import Loops, Pointwise
from .nodes import Buffer, ComputedBuffer, ConstantBuffer, Layout, SharedStorage, StorageBox, TensorBox, make_contiguous_layout
from .views import ReinterpretView, as_strided_layout


def origin_name(node) -> str:
    """How an FX node's op is named in messages and kernel comments: aten.add.Tensor."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


@dataclass
class OutputSpec:
    """How the wrapper produces one graph output."""

    kind: str  # "buffer" | "view" | "none" | "scalar"
    name: str | None = None
    layout: Any = None  # for "view": the FixedLayout over buffer `name`
    expr: Any = None  # for "scalar"


class IRGraph:
    """The IR of one FX graph, built in program order by `lower_graph`."""

    def __init__(self, gm: torch.fx.GraphModule, config=None, target_for=None, compile_subgraph=None):
        self.gm = gm
        # (gm, example inputs, kind) -> a compiled graph: how a branch of torch.cond is compiled
        # (the pipeline's compile_graph, passed in: the pipeline imports the lowerings).
        self.compile_subgraph = compile_subgraph
        self.config = config  # the settings it is compiled under (which backend takes each device)
        # device type -> the Target of the backend the settings choose there (smelt/target.py);
        # the pipeline asks the backend registry.
        self.target_for: Callable[[str], Target] = target_for or (lambda device_type: H100)
        self.buffers: list[Buffer] = []
        self.inputs: list[tuple[str, Any]] = []  # (placeholder name, InputBuffer | sympy expr | None)
        # Inputs whose memory the graph may take once it has read them for the last time: a
        # backward's saved activations that AOTAutograd donates (smelt/saved_inputs.py).
        self.donated_inputs: frozenset[str] = frozenset(getattr(gm, "meta", {}).get("smelt_donated_inputs", ()))
        # Zero-dimensional float CPU inputs Triton kernels read as a value argument, not from memory
        # (Target.host_scalar_args): input name -> the wrapper's variable holding its value.
        self.host_scalars: dict[str, str] = {}
        self.constants: dict[str, ConstantBuffer] = {}
        self.outputs: list[OutputSpec] = []
        self.fallback_ops: list[str] = []
        self.subgraphs: dict[str, object] = {}  # name -> compiled graph called by the wrapper (torch.cond)
        self.subgraph_sources: dict[str, dict] = {}  # name -> where it came from (artifact.GeneratedGraph)
        self.random_seeds: dict = {}  # device -> RandomSeeds, made by the first random op on it
        self.node: torch.fx.Node | None = None
        self._counter = 0
        self._holders: dict | None = None
        # Writes into graph inputs (aten.copy_), registered after everything else: every other
        # buffer, realized however late, reads an input's old contents, so it must come first.
        self.input_writes: list = []
        # Memory filled slice by slice (a cat's pieces written in place), by name: not steps.
        self.shared_storages: dict[str, SharedStorage] = {}
        self.half_rounding_memo: dict = {}  # FX node -> lowering/half_rounding.rounded_to_half's answer
        self.softmax_rows = None  # the lowering's SoftmaxRows: amax/sum pairs lowered as one online reduction

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
        return self.register_computed(copy_loops(data))

    def storage_numel_of(self, name: str):
        """Elements the storage of a buffer, input or constant (by name; storage names included)
        holds at least: what its layout's indices stay below. None when not found."""
        holder = self._holder(name)
        return holder.layout.storage_numel() if holder is not None else None

    def dtype_of(self, name: str) -> torch.dtype:
        """The element type of a buffer, input or constant by name (storage names included)."""
        holder = self._holder(name)
        if holder is None:
            raise KeyError(name)
        return holder.get_dtype()

    def _holder(self, name: str):
        """The constant, input, shared storage or buffer of that name (a buffer also by its storage's)."""
        if self._holders is None or name not in self._holders:  # rebuilt for a name registered since
            self._holders = dict(self.constants)
            self._holders.update((n, v) for n, v in self.inputs if hasattr(v, "layout"))
            self._holders.update(self.shared_storages)
            for b in self.buffers:
                if b.layout is not None:
                    self._holders.setdefault(getattr(b, "storage_name", b.name), b)
                    self._holders[b.name] = b
        return self._holders.get(name)

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



def copy_loops(value) -> Pointwise:
    """A loop nest computing `value` (a TensorBox or what it holds) element by element."""
    return Pointwise(value.get_device(), value.get_dtype(), value.make_loader(), value.get_size(), value.origins)
