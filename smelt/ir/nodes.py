"""IRNode, TensorBox, StorageBox, buffers and layouts.

A lowering returns a TensorBox. Its data is either a StorageBox (something that owns storage:
an unrealized loop nest, or a realized Buffer) or a view of one. Realizing a StorageBox turns its
loop nest into a ComputedBuffer registered with the graph, after which readers load from memory
instead of recomputing the loop body inline.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable, Sequence

import sympy
import torch

from ..symbolic import Expr, contiguous_strides, product, static_int, sympify
from .ops import ops

Index = Sequence[Expr]
Loader = Callable[[Index], object]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a tensor's elements live: size, stride and offset in elements of `dtype`."""

    device: torch.device
    dtype: torch.dtype
    size: tuple
    stride: tuple
    offset: Expr = sympy.Integer(0)

    def index(self, index: Index) -> Expr:
        assert len(index) == len(self.size), (index, self.size)
        return self.offset + sum((i * s for i, s in zip(index, self.stride) if s != 0), sympy.Integer(0))

    def numel(self) -> Expr:
        return product(self.size)

    def is_contiguous(self) -> bool:
        return all(
            sz == 1 or st == want for sz, st, want in zip(self.size, self.stride, contiguous_strides(self.size))
        ) and self.offset == 0

    def storage_numel(self) -> Expr:
        """Elements the storage must hold for every index of this layout to be in bounds."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((sz - 1) * st for sz, st in zip(self.size, self.stride)), sympy.Integer(0))

    def allocated_bytes(self) -> int | None:
        """Bytes a buffer of this layout is allocated with (its offset counted), or None when a
        size is symbolic: what the wrapper's planned peak and the combo pass's live bytes add up."""
        numel = static_int(self.storage_numel())
        return None if numel is None else numel * self.dtype.itemsize

    def __str__(self):
        dt = str(self.dtype).replace("torch.", "")
        return f"{dt}[{', '.join(map(str, self.size))}] stride=({', '.join(map(str, self.stride))}) on {self.device}"


class FixedLayout(Layout):
    """A layout that may not change: graph inputs, extern outputs, anything handed to ATen."""


class FlexibleLayout(Layout):
    """Contiguous until someone who cares (a graph output, an extern call) fixes its strides."""


def make_contiguous_layout(device, dtype, size, cls=FlexibleLayout) -> Layout:
    size = tuple(sympify(s) for s in size)
    return cls(device, dtype, size, tuple(contiguous_strides(size)))


class IRNode:
    origins: frozenset = frozenset()

    def get_size(self) -> list[Expr]:
        raise NotImplementedError

    def get_dtype(self) -> torch.dtype:
        raise NotImplementedError

    def get_device(self) -> torch.device:
        raise NotImplementedError

    def make_loader(self) -> Loader:
        raise NotImplementedError

    def get_numel(self) -> Expr:
        return product(self.get_size())


class Buffer(IRNode):
    """Memory with a name and a layout; readers load from it.

    `storage_offset` is where the tensor starts in its storage (nonzero for an input that is a
    view); layouts count from that start, as kernels receive the tensor's data pointer.
    """

    storage_offset = sympy.Integer(0)
    # What the scheduler asks of every buffer; the kinds that differ set their own.
    has_side_effects = False  # kept, and run, even when nothing reads it (an assert, a print)
    binds_name = True  # the wrapper assigns its value to its name (a scalar binds a size symbol instead)
    mutates: str | None = None  # the existing buffer its elements are written into (ComputedBuffer)
    copy_of: str | None = None  # a write into a graph input of another buffer's values, unchanged
    lives_in: tuple | None = None  # (SharedStorage's name, element offset) when it is a slice of one
    args: tuple = ()  # an ATen call's arguments (ExternKernel)
    kwargs = types.MappingProxyType({})
    condition = None  # a sympy condition on sizes it checks (AssertScalar)

    def __init__(self, name: str, layout: Layout):
        self.name = name
        self.layout = layout

    @property
    def storage_name(self) -> str:
        """The name of the memory it lives in: its own, or the buffer it writes into."""
        return self.name

    def get_size(self):
        return list(self.layout.size)

    def get_dtype(self):
        return self.layout.dtype

    def get_device(self):
        return self.layout.device

    def make_loader(self) -> Loader:
        name, layout = self.name, self.layout
        return lambda index: ops.load(name, layout.index(index))

    def describe(self) -> str:
        return f"{self.name}: {type(self).__name__} {self.layout}"


class InputBuffer(Buffer):
    """A tensor passed to the compiled graph."""


class ConstantBuffer(Buffer):
    """A tensor the graph captured (a get_attr); the wrapper holds it."""

    def __init__(self, name: str, layout: Layout, value: torch.Tensor):
        super().__init__(name, layout)
        self.value = value
        self.scalar = None
        if value.numel() == 1:
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            with unset_fake_temporarily():  # lowering runs under fake mode; this tensor is real
                self.scalar = value.item()

    def make_loader(self) -> Loader:
        if self.scalar is not None:
            # A one-element constant (often a 0-d CPU tensor in a CUDA graph) is inlined as a
            # literal: no memory read, and no pointer from another device handed to a kernel.
            scalar, dtype = self.scalar, self.value.dtype
            return lambda index: ops.constant(scalar, dtype)
        return super().make_loader()


class ComputedBuffer(Buffer):
    """A buffer whose elements a loop nest (Pointwise or Reduction) computes.

    `mutates` names an existing buffer this one's elements are written into instead of fresh
    memory: a graph input (an input mutation), or the buffer a Scatter updates in place.
    """

    def __init__(self, name: str, layout: Layout, data, mutates: str | None = None):
        super().__init__(name, layout)
        self.data = data
        self.mutates = mutates
        self.copy_of: str | None = None  # a write into a graph input of another buffer's values, unchanged
        # (SharedStorage's name, element offset): this buffer is a slice of that storage, a view
        # the wrapper makes, not memory of its own.
        self.lives_in: tuple[str, Expr] | None = None
        self.origins = data.origins

    @property
    def storage_name(self) -> str:
        return self.mutates or self.name

    def make_loader(self) -> Loader:
        name, layout = self.storage_name, self.layout
        return lambda index: ops.load(name, layout.index(index))

    def fix_strides(self, stride: Sequence[Expr]) -> None:
        assert isinstance(self.layout, FlexibleLayout), f"{self.name} already has fixed strides"
        self.layout = FixedLayout(self.layout.device, self.layout.dtype, self.layout.size, tuple(stride))

    def describe(self) -> str:
        target = f" (writes into {self.mutates})" if self.mutates else ""
        if self.lives_in:
            target = f" (slice of {self.lives_in[0]} at {self.lives_in[1]})"
        return f"{self.name}: {self.layout}{target} = {self.data}"


class SharedStorage(Buffer):
    """Memory that several ComputedBuffers fill, each its own slice: a cat of many pieces, each
    piece written in place. No kernel computes it as a whole; the wrapper allocates it with its
    first slice, and a reader runs after every slice's writer."""

    def describe(self) -> str:
        return f"{self.name}: {self.layout}, filled by the slices that live in it"


class _Wrapper(IRNode):
    """Asks its data for everything about the tensor it stands for."""

    def __init__(self, data: IRNode):
        self.data = data

    def get_size(self):
        return self.data.get_size()

    def get_dtype(self):
        return self.data.get_dtype()

    def get_device(self):
        return self.data.get_device()

    def make_loader(self) -> Loader:
        return self.data.make_loader()


class StorageBox(_Wrapper):
    """Owns storage: an unrealized loop nest until `realize`, then a Buffer.

    One that its readers recompute (`keep_recomputed`) stays a loop nest: a reader lowered before
    a later op asks for memory may load through the box when its kernel is generated, so the box
    must not turn into a buffer computed after that reader. The op asking gets a copy of its
    own, computed where it asks."""

    recomputed = False
    _copy = None

    def keep_recomputed(self) -> None:
        self.recomputed = True

    @property
    def origins(self):
        # The ops a reader inlines: none once realized (the reader loads from memory).
        return frozenset() if self.is_realized() else self.data.origins

    def is_realized(self) -> bool:
        return isinstance(self.data, Buffer)

    def realize(self, graph) -> Buffer:
        if self.recomputed:
            if self._copy is None:
                self._copy = graph.register_computed(self.data)
            return self._copy
        if not self.is_realized():
            self.data = graph.register_computed(self.data)
        return self.data

    def __str__(self):
        return f"StorageBox({self.data})"


class TensorBox(_Wrapper):
    """What a lowering returns: a handle whose data may be replaced by a realized form."""

    @staticmethod
    def of_storage(node: IRNode) -> "TensorBox":
        return TensorBox(StorageBox(node))

    @property
    def origins(self):
        return self.data.origins

    def __str__(self):
        return f"TensorBox({self.data})"
