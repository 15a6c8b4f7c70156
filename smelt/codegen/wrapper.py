"""Prints the Python module that runs one compiled graph: bind sizes, allocate, launch, free, return."""
from __future__ import annotations

import dataclasses
import re

import sympy
import torch

from ..ir import InputBuffer
from ..ir.control_flow import Conditional
from ..ir.extern import ExternKernel, MultiOutput
from ..ir.scalars import AssertScalar, DynamicScalar
from ..ir.views import ReinterpretView
from ..symbolic import pexpr
from .common import IndentedBuffer


def _device_name(device: torch.device) -> str:
    return f"{device.type}{device.index if device.index is not None else ''}"


# smelt's own ops whose wrapper calls skip the dispatcher: the op's name -> (module, function, the
# name the wrapper imports it as).
DIRECT_CALLS = {"smelt::short_attention": ("smelt.runtime.short_attention", "call", "smelt_short_attention"),
                "smelt::short_attention_backward": ("smelt.runtime.short_attention", "call_backward",
                                                    "smelt_short_attention_backward"),
                "smelt::depthwise_weight_gradient": ("smelt.runtime.depthwise_weight_gradient", "run",
                                                     "smelt_depthwise_weight_gradient")}


def op_source(op) -> str:
    """Python source naming an ATen op overload or a higher-order op (auto_functionalized_v2)."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{op.name()}"
    if isinstance(op, torch._ops.OpOverload) and op._schema.name in DIRECT_CALLS:
        return DIRECT_CALLS[op._schema.name][2]
    if _has_public_binding(op):
        return f"torch.{op._opname}"
    return f"torch.ops.{op.namespace}.{op._opname}.{op._overloadname}"


# Overloads beside `default` that need an argument the default does not take (`out=`, the matrix
# products' `out_dtype`), so a call with the default's arguments cannot reach them.
_UNREACHABLE_OVERLOADS = {"out", "dtype", "dtype_out"}


def _has_public_binding(op) -> bool:
    """Whether `torch.<name>(...)` calls exactly this overload. Its argument parsing is in C++,
    where an OpOverload's call boxes each argument through the op's schema: 2.8 against 7.2 us per
    call of a small CPU convolution (lists of ints), 1.0 against 1.7 for a product."""
    if op.namespace != "aten" or op._overloadname != "default":
        return False
    name = op._opname
    if not hasattr(torch._C._VariableFunctions, name) or getattr(torch, name, None) is not \
            getattr(torch._C._VariableFunctions, name):
        return False  # no binding, or torch.<name> is a Python function around it
    return set(op._overloadpacket.overloads()) <= {"default"} | _UNREACHABLE_OVERLOADS


def op_name(buffer) -> str:
    op = getattr(buffer, "op", None) or getattr(getattr(buffer, "parent", None), "op", None)
    return str(op) if op is not None else type(buffer).__name__


def _written_arguments(buffer) -> list:
    """The arguments an ATen call may write into."""
    op = buffer.op
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable:
        return [*buffer.args, *buffer.kwargs.values()]
    writes = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    positional = [a for a, s in zip(buffer.args, op._schema.arguments) if s.name in writes]
    return positional + [v for k, v in buffer.kwargs.items() if k in writes]


class WrapperCodegen:
    def __init__(self, graph, schedule, kernels: dict, title: str):
        self.graph = graph
        self.schedule = schedule
        self.kernels = kernels  # step index -> TritonKernelSource
        self.title = title
        self.devices: dict[str, torch.device] = {}
        self.bound: set[sympy.Symbol] = set()
        self.uses_layout_check = False
        self.uses_host_scalars = False
        self.direct_calls: set[tuple[str, str, str]] = set()  # DIRECT_CALLS entries the wrapper imports
        self.uses_cpu_allocator = False
        # The one CUDA device the graph's buffers are on, if one: allocated through ATen's C++ core
        # with it made current for the call (2-3 us less host time per buffer than torch.empty_strided).
        cuda = {b.layout.device for b in [*graph.buffers, *graph.shared_storages.values()]
                if getattr(getattr(b, "layout", None), "device", None) is not None and b.layout.device.type == "cuda"}
        self.cuda_device = next(iter(cuda)) if len(cuda) == 1 and next(iter(cuda)).index is not None else None
        self.uses_cuda_allocator = False
        self.size_sources: list[str] = []  # each bound size symbol's value, read from `args`
        # Bytes of the buffers the wrapper holds at once, at most (None: a size is symbolic).
        self.live: dict[str, int] = {}
        self.peak: int | None = 0
        self.at_peak: dict[str, int] = {}  # the buffers alive at the peak, by name
        self.pooled = set(schedule.pool.values())  # dead buffers a later buffer takes: not freed
        # CPU buffers with a place in the graph's workspace (scheduler/workspace.py), in the order
        # the wrapper takes them: their index in `workspace`.
        self.workspace = schedule.workspace.offsets if schedule.workspace is not None else {}
        self.workspace_order: list[str] = []
        self.graph_blockers: list[str] = []  # why a CUDA graph cannot record this call (runtime/cuda_graphs.py)

    def literal(self, value) -> str:
        """Python source for an extern call's argument."""
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.literal(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, ReinterpretView):
            return self.strided(value.name, value.layout)
        if isinstance(value, (InputBuffer,)) or hasattr(value, "layout") and hasattr(value, "name"):
            return getattr(value, "storage_name", None) or value.name
        if isinstance(value, sympy.Expr):
            return pexpr(value)
        if isinstance(value, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            return op_source(value)
        if isinstance(value, torch.device):
            return self.device(value)
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            return str(value)
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return f'float("{value}")'
        return repr(value)

    def device(self, device: torch.device) -> str:
        name = _device_name(device)
        self.devices[name] = device
        return name

    def strided(self, name: str, layout) -> str:
        size = ", ".join(pexpr(s) for s in layout.size)
        stride = ", ".join(pexpr(s) for s in layout.stride)
        # torch.as_strided's C++ twin without the view bookkeeping (half the host time); its
        # offset, like a layout's, counts from the tensor's own start.
        offset = f", {pexpr(layout.offset)}" if layout.offset != 0 else ""
        return f"reinterpret_tensor({name}, ({size}{',' if len(layout.size) == 1 else ''}), " \
               f"({stride}{',' if len(layout.stride) == 1 else ''}){offset})"

    def allocate(self, out: IndentedBuffer, name: str, layout) -> None:
        size = ", ".join(pexpr(s) for s in layout.size)
        stride = ", ".join(pexpr(s) for s in layout.stride)
        comma = "," if len(layout.size) == 1 else ""
        if layout.device.type == "cpu":
            # torch.empty_strided's C++ core, without the Python argument parsing: half its host time.
            self.uses_cpu_allocator = True
            out.writeline(f"{name} = empty_strided_cpu(({size}{comma}), ({stride}{comma}), {layout.dtype})")
            return
        if layout.device == self.cuda_device:
            self.uses_cuda_allocator = True
            out.writeline(f"{name} = empty_strided_cuda(({size}{comma}), ({stride}{comma}), {layout.dtype})")
            return
        out.writeline(f"{name} = torch.empty_strided(({size}{comma}), ({stride}{comma}), "
                      f"device={self.device(layout.device)}, dtype={layout.dtype})")

    def hold(self, name: str, layout) -> None:
        """`name` holds memory of `layout` from now until a `del` of it (the planned peak)."""
        if self.peak is None or layout is None or not hasattr(layout, "dtype"):
            return
        size = layout.allocated_bytes()
        if size is None:
            self.peak = None
            return
        self.live[name] = size
        total = sum(self.live.values())
        if total > self.peak:
            self.peak, self.at_peak = total, dict(self.live)

    def peak_comment(self) -> str:
        """Where the planned peak's bytes are, for a reader of the wrapper: its largest buffers."""
        if not self.peak or not self.at_peak:
            return ""
        largest = sorted(self.at_peak.items(), key=lambda item: -item[1])[:4]
        named = ", ".join(f"{name} {_size(size)}" for name, size in largest)
        more = f" (the largest {len(largest)} of {len(self.at_peak)})" if len(self.at_peak) > len(largest) else ""
        return f"  # {_size(self.peak)} at once: {named}{more}"

    def free(self, out: IndentedBuffer, names) -> None:
        """Drops the buffers dead after a step, but those a later buffer takes (scheduler/pool.py),
        which keep their memory until then."""
        dropped = [name for name in names if name not in self.pooled]
        if dropped:
            out.writeline(f"del {', '.join(dropped)}")
            for name in dropped:
                self.live.pop(name, None)

    def take(self, out: IndentedBuffer, buffer, dead) -> None:
        """`buffer` takes the memory of `dead`, a buffer of its size no kernel reads any more."""
        mine, theirs = buffer.layout, dead.layout
        taken = dead.name
        if (list(mine.size), list(mine.stride)) != (list(theirs.size), list(theirs.stride)):
            taken = self.strided(dead.name, mine)
        out.writeline(f"{buffer.name} = {taken}; del {dead.name}  # dead {dead.name}'s memory")
        if self.peak is not None and dead.name in self.live:
            self.live[buffer.name] = self.live.pop(dead.name)

    def reuse(self, out: IndentedBuffer, buffer, dying) -> None:
        """`buffer` takes the memory of the buffer `dying`, which this kernel reads for the last
        time, at the elements it writes (scheduler/reuse.py)."""
        mine, theirs = buffer.layout, dying.layout
        taken = dying.name
        if (list(mine.size), list(mine.stride)) != (list(theirs.size), list(theirs.stride)):
            taken = self.strided(dying.name, mine)  # another shape over the same memory
        out.writeline(f"{buffer.name} = {taken}  # written over {dying.name}, read for the last time here")
        if self.peak is not None and dying.name in self.live:
            self.live[buffer.name] = self.live.pop(dying.name)

    def allocate_buffer(self, out: IndentedBuffer, buffer, allocated: set[str]) -> None:
        """Memory for `buffer`, or for a slice of a shared storage its view (the storage first)."""
        lives_in = getattr(buffer, "lives_in", None)
        if buffer.name in self.workspace:
            out.writeline(f"{buffer.name} = workspace[{len(self.workspace_order)}]")
            self.workspace_order.append(buffer.name)
            self.hold(buffer.name, buffer.layout)
        elif lives_in is None:
            self.allocate(out, buffer.name, buffer.layout)
            self.hold(buffer.name, buffer.layout)
        else:
            storage, offset = lives_in
            if storage not in allocated:
                self.allocate(out, storage, self.graph.shared_storages[storage].layout)
                self.hold(storage, self.graph.shared_storages[storage].layout)
                allocated.add(storage)
            layout = buffer.layout
            out.writeline(f"{buffer.name} = {self.strided(storage, dataclasses.replace(layout, offset=offset))}")
        allocated.add(buffer.name)

    def workspace_layouts(self, out: IndentedBuffer) -> None:
        """The block the call-local CPU buffers live in, and each one's place and layout."""
        buffers = {b.name: b for b in self.graph.buffers}
        out.writeline("from smelt.runtime.cpu_workspace import CpuWorkspace")
        out.writeline(f"cpu_workspace = CpuWorkspace({self.schedule.workspace.size}, [  # bytes; (offset, size, stride, dtype)")
        for name in self.workspace_order:
            layout = buffers[name].layout
            size = ", ".join(pexpr(s) for s in layout.size) + ("," if len(layout.size) == 1 else "")
            stride = ", ".join(pexpr(s) for s in layout.stride) + ("," if len(layout.stride) == 1 else "")
            out.writeline(f"    ({self.workspace[name]}, ({size}), ({stride}), {layout.dtype}),  # {name}")
        out.writeline("])")

    def bind_sizes(self, out: IndentedBuffer) -> None:
        passed = {arg for kernel in self.kernels.values() for arg in getattr(kernel, "size_args", ())}
        for name, value in self.graph.host_scalars.items():
            if value in passed:  # a Triton kernel reads it
                out.writeline(f"{value} = HostDouble({name}.item())")
                self.uses_host_scalars = True
        for position, (name, value) in enumerate(self.graph.inputs):
            if isinstance(value, sympy.Symbol) and value not in self.bound:
                out.writeline(f"{value} = {name}")
                self.size_sources.append(f"args[{position}]")
                self.bound.add(value)
            elif isinstance(value, InputBuffer):
                layout = value.layout
                for what, exprs in (("size", layout.size), ("stride", layout.stride)):
                    for d, e in enumerate(exprs):
                        if isinstance(e, sympy.Symbol) and e not in self.bound:
                            out.writeline(f"{e} = {name}.{what}({d})")
                            self.size_sources.append(f"args[{position}].{what}({d})")
                            self.bound.add(e)

    def mutated_inputs(self) -> list[int]:
        """Positions of the inputs the graph writes into (an input mutation kept in the graph)."""
        names = {name: position for position, (name, value) in enumerate(self.graph.inputs)
                 if isinstance(value, InputBuffer)}
        written = set()
        for buffer in self.graph.buffers:
            if getattr(buffer, "mutates", None) in names:
                written.add(names[buffer.mutates])
            if isinstance(buffer, ExternKernel) and buffer.has_side_effects:
                # An ATen call kept for its effect (copy_ into an input): the inputs its schema says
                # it writes, or any input it is passed where no schema says.
                for arg in _written_arguments(buffer):
                    if getattr(arg, "name", None) in names:
                        written.add(names[arg.name])
        return sorted(written)

    def written_donated_inputs(self) -> list[int]:
        """Positions of the donated inputs (a backward's saved activations) whose memory a later
        buffer takes over, in place or from the pool."""
        taken = set(self.schedule.reuses.values()) | set(self.schedule.pool.values())
        return [position for position, (name, _) in enumerate(self.graph.inputs)
                if name in self.graph.donated_inputs and name in taken]

    def graph_facts(self, out: IndentedBuffer, body: str) -> None:
        """What runtime/cuda_graphs.py reads of the graph: the values its sizes are made of (one
        recording per distinct tuple), the inputs it writes, and why it cannot be recorded."""
        devices = {v.layout.device.type for _, v in self.graph.inputs if isinstance(v, InputBuffer)}
        devices |= {b.layout.device.type for b in self.graph.buffers if hasattr(getattr(b, "layout", None), "device")}
        # A constant the kernels inline as a literal (DeBERTa's CPU scalars in its GPU graphs) is
        # no tensor of the call's: only those the call names count.
        devices |= {c.layout.device.type for name, c in self.graph.constants.items()
                    if re.search(rf"\b{re.escape(name)}\b", body)}
        if "cpu" in devices:
            self.graph_blockers.append("it has CPU tensors")
        out.writeline(f"GRAPH_DEVICE_TYPES = {tuple(sorted(devices))!r}")
        out.writeline(f"MUTATED_INPUTS = {tuple(self.mutated_inputs())!r}")
        if self.graph.donated_inputs:  # what a kept graph's backward must be given copies of (backend.py)
            out.writeline(f"WRITTEN_DONATED_INPUTS = {tuple(self.written_donated_inputs())!r}")
        out.writeline(f"CUDA_GRAPH_BLOCKERS = {tuple(dict.fromkeys(self.graph_blockers))!r}")
        # The most bytes of buffers this wrapper allocates that are alive at once (inputs not counted).
        out.writeline(f"PLANNED_PEAK_BYTES = {self.peak!r}{self.peak_comment()}")
        out.writeline("")
        out.writeline("")
        out.writeline("def size_key(args):")
        comma = "," if len(self.size_sources) == 1 else ""
        out.writeline(f"    return ({', '.join(self.size_sources)}{comma})")

    def generate(self) -> str:
        body = IndentedBuffer(1)
        input_names = [name for name, _ in self.graph.inputs]
        if input_names:
            body.writeline(f"{', '.join(input_names)}{',' if len(input_names) == 1 else ''} = args")
        body.writeline("args.clear()")
        if self.workspace:
            body.writeline("workspace = cpu_workspace.buffers()  # this thread's, made at its first call")
        self.bind_sizes(body)
        buffers = {b.name: b for b in self.graph.buffers}
        buffers.update((name, v) for name, v in self.graph.inputs if name in self.graph.donated_inputs)
        allocated = {name for name, v in self.graph.inputs} | set(self.graph.constants)
        for k, step in enumerate(self.schedule.steps):
            if step.is_extern:
                self.extern_call(body, step.group.nodes[0].buffer)
            else:
                kernel = self.kernels[k]
                for name in step.stored + [n for f in step.finishers for n in f.stored]:
                    if name in allocated:  # a later kernel writing it again (a scatter's updates)
                        continue
                    if name in self.schedule.reuses:
                        self.reuse(body, buffers[name], buffers[self.schedule.reuses[name]])
                        allocated.add(name)
                    elif name in self.schedule.pool:
                        self.take(body, buffers[name], buffers[self.schedule.pool[name]])
                        allocated.add(name)
                    else:
                        self.allocate_buffer(body, buffers[name], allocated)
                if step.combo:
                    args = [buffer for member in kernel.member_buffers for buffer in member] + list(kernel.scalars)
                    body.writeline(f"{kernel.name}({', '.join(args)})")
                    self.free(body, step.frees)
                    continue
                args = [buffer for _, buffer in kernel.params] + list(kernel.size_args)
                args.append(pexpr(kernel.xnumel))
                if kernel.rnumel is not None:
                    args.append(pexpr(kernel.rnumel))
                body.writeline(f"{kernel.name}({', '.join(args)})")
            self.free(body, step.frees)
        results = [self.output(o) for o in self.graph.outputs]
        body.writeline(f"return ({', '.join(results)}{',' if len(results) == 1 else ''})")

        out = IndentedBuffer()
        out.writeline(f"# smelt wrapper: {self.title}")
        for kernel in self.kernels.values():
            out.writeline(f"# {kernel.name}: {', '.join(kernel.origins)}")
        out.writeline("import math")
        out.writeline("import torch")
        out.writeline("from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret_tensor")
        if self.uses_cpu_allocator:
            out.writeline("from torch._C._dynamo.guards import _empty_strided_cpu as empty_strided_cpu")
        if self.uses_cuda_allocator:
            out.writeline("from torch._C._dynamo.guards import _empty_strided_cuda as empty_strided_cuda")
        if self.uses_layout_check:
            out.writeline("from smelt.runtime.extern_layout import as_planned")
        if self.uses_host_scalars:
            out.writeline("from smelt.runtime.host_scalar import HostDouble")
        for module, function, name in sorted(self.direct_calls):
            out.writeline(f"from {module} import {function} as {name}")
        for name, device in self.devices.items():
            out.writeline(f"{name} = torch.device({str(device)!r})")
        if self.workspace:
            self.workspace_layouts(out)
        out.writeline("")
        out.writeline("")
        self.graph_facts(out, body.getvalue())
        out.writeline("")
        out.writeline("")
        out.writeline("def call(args):")
        if self.uses_cuda_allocator:
            # empty_strided_cuda allocates on the current device.
            out.writeline(f"    with torch.cuda._DeviceGuard({self.cuda_device.index}):")
            out.lines.extend(("    " + line) if line else line for line in body.lines)
        else:
            out.splice(body)
        return out.getvalue()

    def extern_call(self, out: IndentedBuffer, buffer) -> None:
        if isinstance(buffer, MultiOutput):
            out.writeline(f"{buffer.name} = {buffer.parent.name}{''.join(f'[{i}]' for i in buffer.path)}")
            self.hold(buffer.name, buffer.layout)  # the part of its parent's outputs it names
            self.bind_unbacked(out, buffer)
            self.check_planned_layout(out, buffer, getattr(buffer.parent, "op", type(buffer.parent).__name__))
            return
        if isinstance(buffer, DynamicScalar):
            self.graph_blockers.append("it reads a device value on the host (.item())")
            out.writeline(f"{buffer.symbol} = {self.literal(buffer.source)}.item()")
            self.bound.add(buffer.symbol)
            return
        if isinstance(buffer, Conditional):
            self.graph_blockers.append("it branches on a value (torch.cond)")
            pred = buffer.predicate
            test = f"{self.literal(pred)}.item()" if hasattr(pred, "name") else self.literal(pred)
            operands = ", ".join(self.literal(o) for o in buffer.operands)
            out.writeline(f"{buffer.name} = ({buffer.true_branch} if {test} else {buffer.false_branch})([{operands}])")
            return
        if isinstance(buffer, AssertScalar):
            out.writeline(f"if not ({pexpr(buffer.condition)}):")
            out.writeline(f"    raise RuntimeError({buffer.message!r})")
            return
        assert isinstance(buffer, ExternKernel)
        op = buffer.op
        target = op_source(op)
        if isinstance(op, torch._ops.OpOverload) and op._schema.name in DIRECT_CALLS:
            self.direct_calls.add(DIRECT_CALLS[op._schema.name])
        args = [self.literal(a) for a in buffer.args]
        args += [f"{k}={self.literal(v)}" for k, v in buffer.kwargs.items()]
        note = "  # no smelt lowering: runs in ATen" if buffer.is_fallback else ""
        if buffer.name in self.workspace:  # a product written into its place (scheduler/workspace.py)
            out.writeline(f"{buffer.name} = workspace[{len(self.workspace_order)}]")
            self.workspace_order.append(buffer.name)
            target = target if _has_public_binding(op) else f"torch.ops.aten.{op._opname}.out"
            out.writeline(f"{target}({', '.join(args + [f'out={buffer.name}'])}){note}")
            self.hold(buffer.name, buffer.layout)
            return
        out.writeline(f"{buffer.name} = {target}({', '.join(args)}){note}")
        self.hold(buffer.name, buffer.layout)
        self.bind_unbacked(out, buffer)
        self.check_planned_layout(out, buffer, op)

    def check_planned_layout(self, out: IndentedBuffer, buffer, op) -> None:
        """An ATen result read by kernels with the strides of its traced value (runtime/extern_layout.py)."""
        layout = buffer.layout
        if layout is None or any(not (e.free_symbols <= self.bound) for e in (*layout.size, *layout.stride)):
            return  # a size only the result itself tells (an unbacked one)
        if sum(n != 1 for n in layout.size) < 2:
            return  # at most one dim longer than 1: every stride order is the same memory
        self.uses_layout_check = True
        size = ", ".join(pexpr(s) for s in layout.size)
        stride = ", ".join(pexpr(s) for s in layout.stride)
        out.writeline(f"{buffer.name} = as_planned({buffer.name}, ({size},), ({stride},), {str(op)!r})")

    def bind_unbacked(self, out: IndentedBuffer, buffer) -> None:
        """Binds the size symbols an ATen call's output introduces (u0 for nonzero's row count,
        x[mask]'s length, unique's...): later sizes and kernel arguments use them."""
        if buffer.layout is None:
            return
        layout = buffer.layout
        for what, exprs in (("size", layout.size), ("stride", layout.stride)):
            for d, e in enumerate(exprs):
                if not isinstance(e, sympy.Expr):
                    continue
                # A size that is an unbound symbol alone; an expression of one (2*u0) is not
                # what ATen's data-dependent ops return.
                if isinstance(e, sympy.Symbol) and e not in self.bound:
                    out.writeline(f"{e} = {buffer.name}.{what}({d})")
                    self.graph_blockers.append(f"a size depends on the data ({op_name(buffer)})")
                    self.bound.add(e)

    def output(self, spec) -> str:
        if spec.kind == "none":
            return "None"
        if spec.kind == "scalar":
            return pexpr(spec.expr) if isinstance(spec.expr, sympy.Expr) else repr(spec.expr)
        if spec.kind == "view":
            return self.strided(spec.name, spec.layout)
        return spec.name


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
