"""One kernel run as torch operations: each member's loop body is called once, with the kernel's
xindex and rindex as aranges, so every value is a whole [X, 1] or [X, R] tensor. Loads gather from
the flat storage of the tensor passed (from its first element, as a printed kernel's pointer),
members read each other's values as the printed kernels do, and stores scatter into storage once
every value is made, so an input updated in place is read before it is written."""
from __future__ import annotations

import functools

import torch

from ...scheduler.placement import Placement
from ..common import register_dtype
from ..kernel_body import KernelBody
from .handler import ReferenceOps
from .index import evaluate
from .reductions import reduce, scan

_SCATTER_REDUCE = {"atomic_max": "amax", "atomic_min": "amin", "atomic_mul": "prod"}


def flat_storage(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view of the tensor's storage from its first element to the storage's end."""
    start = tensor.storage_offset()
    count = tensor.untyped_storage().nbytes() // tensor.element_size() - start
    return tensor.as_strided((max(count, 0),), (1,), start)


_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


class ReferenceKernel:
    """What the wrapper calls: kernel(*buffers, *sizes, xnumel[, rnumel])."""

    def __init__(self, name: str, plan, inputs: list[str], size_args: list[str], kept: dict, origins: list[str],
                 source: str):
        self.name = name
        self.plan = plan
        self.inputs = frozenset(inputs)
        outputs = [n.write_name for n in plan.nodes if n.write_name in plan.stored]
        buffers = list(dict.fromkeys(inputs + outputs))
        self.params = [(b, b) for b in buffers]
        self.size_args = size_args
        self.kept = kept  # buffers read from the graph input that holds them (scheduler plan_memory)
        self.origins = origins
        self.source = source
        self.xnumel = plan.xnumel
        self.rnumel = plan.rnumel if plan.blocks_2d else None

    def __call__(self, *args):
        count = len(self.params)
        tensors = {b: t for (b, _), t in zip(self.params, args)}
        sizes = dict(zip(self.size_args, args[count:]))
        extents = args[count + len(self.size_args):]
        xnumel, rnumel = int(extents[0]), int(extents[1]) if len(extents) > 1 else 1
        if xnumel == 0:
            return
        KernelRun(self, tensors, sizes, xnumel, rnumel).run()


class KernelRun(KernelBody):
    """One call of a reference kernel: each member's body run on whole tensors of (x, r) lanes."""

    def __init__(self, kernel: ReferenceKernel, tensors: dict, sizes: dict, xnumel: int, rnumel: int):
        super().__init__(kernel.plan)
        self.kernel = kernel
        self.tensors = tensors
        self.device = next(iter(tensors.values())).device
        self.shape = (xnumel, rnumel)
        self.env = dict(sizes)
        self.env["xindex"] = torch.arange(xnumel, device=self.device).view(xnumel, 1)
        self.env["rindex"] = torch.arange(rnumel, device=self.device).view(1, rnumel)
        self.handler = ReferenceOps(self)
        self.scattered: dict[str, torch.Tensor] = {}  # scatter member -> the element each lane writes
        self.indirect: list = []

    def run(self) -> None:
        """Members in the plan's order, each stored once computed, as a program of a printed kernel
        does: a later member may read it back through the storage it is a slice of (a cat's last
        piece, then a sum over the whole cat). A store into a buffer the kernel reads (in place)
        waits until every member has read the old values."""
        in_place = []
        for node in self.plan.nodes:
            self.value_of(node)
            if node.write_name in self.plan.stored:
                if node.write_name in self.kernel.inputs:
                    in_place.append(node)
                else:
                    self.store(node)
        for node in in_place:
            self.store(node)

    def ops(self) -> ReferenceOps:
        return self.handler

    def value_of(self, node) -> torch.Tensor:
        if node.name not in self.node_values:  # every value is a whole tensor: computed once
            self.node_values[node.name] = self.compute(node)
        return self.node_values[node.name]

    def compute(self, node) -> torch.Tensor:
        placement = self.plan.placement[node.name]
        value = self.body_value(node)
        if node.is_scatter:
            self.scattered[node.name] = evaluate(self.scatter_offset(node), self.env, self.device)
        if placement == Placement.SCAN:
            return scan(self, node, value)
        if placement == Placement.REDUCTION:
            return reduce(self, node, value)
        value = self.handler.to_dtype(value, node.data.dtype)
        return value.broadcast_to(self.shape if placement == Placement.XR else (self.shape[0], 1))

    def load(self, buffer: str, index) -> torch.Tensor:
        fused = self.fused_value(buffer)
        if fused is not None:
            return fused
        flat = flat_storage(self.tensors[self.kernel.kept.get(buffer, buffer)])
        position = evaluate(index, self.env, self.device)
        position = self.check_bounds(position, flat.numel(), f"a load of {buffer}")
        if flat.numel() == 0:  # every lane reading it is masked off
            flat = torch.zeros(1, dtype=flat.dtype, device=flat.device)
        return flat[position].to(register_dtype(flat.dtype))

    def active(self) -> torch.Tensor | None:
        return functools.reduce(torch.logical_and, self.mask_stack) if self.mask_stack else None

    def check_bounds(self, position: torch.Tensor, size, what: str) -> torch.Tensor:
        """position with the lanes that masks turn off clamped into [0, size); an active lane out
        of bounds raises IndexError, as the Triton interpreter's and Halide's checks do."""
        inside = (position >= 0) & (position < size)
        if bool(inside.all()):
            return position
        active = self.active()
        outside = ~inside if active is None else ~inside & active
        # A kernel over empty rows may read its per-row values for none of them (Triton masks those).
        if bool(outside.any()) and self.shape[1] > 0:
            raise IndexError(f"smelt: index out of bounds in {self.kernel.name}: {what} outside [0, {int(size)})")
        return torch.where(inside, position, torch.zeros_like(position))

    def store(self, node) -> None:
        placement = self.plan.placement[node.name]
        flat = flat_storage(self.tensors[node.write_name])
        value = self.node_values[node.name]
        if node.is_scatter:
            position = self.scattered[node.name]
        else:
            position = evaluate(node.store_index(placement, self.plan.xnumel, self.plan.rnumel), self.env, self.device)
        position, value = torch.broadcast_tensors(position, value)
        position, value = position.reshape(-1), value.reshape(-1).to(flat.dtype)
        mode = node.data.mode if node.is_scatter else None
        if mode is None and flat.dtype in _SIGNED_TWIN:
            # torch has no index_put for uint16/32/64: the same bits, stored as the signed type.
            flat.view(_SIGNED_TWIN[flat.dtype])[position] = value.view(_SIGNED_TWIN[flat.dtype])
        elif mode is None:
            flat[position] = value
        elif mode == "atomic_add":
            flat.index_put_((position,), value, accumulate=True)
        else:
            flat.scatter_reduce_(0, position, value, _SCATTER_REDUCE[mode])
