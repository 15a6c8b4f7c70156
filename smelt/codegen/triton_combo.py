"""One launch for many kernels with the same body (scheduler/combo.py gathers them).

The body is generated once, as a function of its buffers' pointers, xnumel and the block it
runs. The launched kernel reads, per program, which member and which block of it to run from a
work table, and the member's pointers and element count from a pointer table:

    member, block = work[pid]
    in_ptr0, ..., xnumel = table[member]
    body(in_ptr0, ..., xnumel, block)

So the kernel's source, and its compile, do not grow with the number of members: an Adam step
over 150 parameters is one compile of one Adam body. Members are kernels over a flat range
(pointwise, not tiled) with static sizes; the body is generated with its mask on, since member
sizes differ. The launcher (runtime/combo_launcher.py) builds both tables.
"""
from __future__ import annotations

import collections
import dataclasses

from ..scheduler.schedule import Step
from ..symbolic import static_int
from .simd import plan_kernel
from .triton import BlockConfig, TritonKernel, index_dtype_for
from .triton_ops import triton_type

# Every member runs in blocks of this many elements: big enough for wide loads, and a tiny
# member wastes only masked lanes of one block.
COMBO_CONFIG = BlockConfig(XBLOCK=1024, RBLOCK=None, num_warps=4, persistent=False)


@dataclasses.dataclass
class MemberBody:
    """One combinable kernel, generated as a body function: its text is the combo key."""

    kernel: TritonKernel
    text: str
    pointers: list[tuple[str, str]]  # (parameter, buffer), in the body's order
    xnumel: int


class ComboBodies:
    """Generates each candidate step's body once; `key` is what scheduler/combo.py groups by."""

    def __init__(self, graph, interpret_for, eviction_hints: bool, steps: list[Step]):
        self.graph = graph
        self.interpret_for = interpret_for  # step -> whether its kernel is interpreted
        self.eviction_hints = eviction_hints
        self.bodies: dict[int, MemberBody] = {}
        # Only a step whose outline another step shares can have its body: the others are not
        # generated twice (once here, once as their own kernel).
        counts = collections.Counter(_outline(s) for s in steps if not s.is_extern)
        self.shared = {outline for outline, n in counts.items() if n > 1}

    def key(self, step: Step):
        if _outline(step) not in self.shared:
            return None
        body = self.body(step)
        if body is None:
            return None
        dtypes = tuple(self.graph.dtype_of(buffer) for _, buffer in body.pointers)
        return body.text, dtypes, str(step.group.nodes[0].buffer.get_device()), self.interpret_for(step)

    def body(self, step: Step) -> MemberBody | None:
        if id(step) in self.bodies:
            return self.bodies[id(step)]
        body = None
        group = step.group
        xn = static_int(group.xnumel)
        if not group.is_reduction and xn and not any(n.is_scatter for n in group.nodes):
            plan = plan_kernel(group, step.stored)
            if plan.tiling is None and plan.stored:
                kernel = TritonKernel(plan, COMBO_CONFIG, self.graph, index_dtype_for(plan, self.graph),
                                      self.interpret_for(step), masks=(True, False),
                                      eviction_hints=self.eviction_hints, program_arg=True)
                text = kernel.function_source("BODY")
                pointers, sizes = kernel.launch_args()
                if not sizes:  # a size passed by name would differ between members
                    body = MemberBody(kernel, text, pointers, xn)
        self.bodies[id(step)] = body
        return body


def _outline(step: Step) -> tuple:
    """What two steps with one body surely share: their ops, the dtypes they make, their device."""
    nodes = step.group.nodes
    return (str(nodes[0].buffer.get_device()), step.group.is_reduction, len(step.stored),
            tuple(sorted(o for n in nodes for o in n.buffer.origins)), tuple(n.buffer.get_dtype() for n in nodes))


@dataclasses.dataclass
class ComboKernelSource:
    """A combo kernel and what the wrapper needs to launch it: each member's buffers in order."""

    name: str
    source: str
    member_buffers: list[list[str]]
    member_numels: list[int]
    pointers_per_member: int
    config: BlockConfig
    origins: list[str]


def combo_kernel(step: Step, bodies: ComboBodies, graph, interpret: bool, index: int) -> ComboKernelSource:
    members = [bodies.body(m) for m in step.combo]
    first = members[0]
    origins = sorted({o for m in step.combo for n in m.group.nodes for o in n.buffer.origins})
    ops = sorted({o.split(".")[1].strip("_") for o in origins if o.count(".") >= 1})
    name = f"triton_combo_{'_'.join([o for o in ops if o][:5]) or 'copy'}_{index}"
    body_name = f"{name}_body"
    params = [p for p, _ in first.pointers]
    dtypes = [graph.dtype_of(buffer) for _, buffer in first.pointers]
    slots = len(params) + 1
    lines = [
        "",
        "@triton.jit",
        f"def {name}(work_ptr, table_ptr, XBLOCK: tl.constexpr):",
        "    # This program's member and block (work table), then where that member's buffers are.",
        "    member = tl.load(work_ptr + 2 * tl.program_id(0))",
        "    block = tl.load(work_ptr + 2 * tl.program_id(0) + 1)",
        f"    slots = table_ptr + member * {slots}",
    ]
    for k, (param, dtype) in enumerate(zip(params, dtypes)):
        lines.append(f"    {param} = tl.load(slots + {k}).to(tl.pointer_type({triton_type(dtype)}))")
    lines.append(f"    xnumel = tl.load(slots + {len(params)})")
    lines.append(f"    {body_name}({', '.join(params)}, xnumel, block, XBLOCK)")
    written = [m.stored[0] for m in step.combo if m.stored]
    shown = ", ".join(written[:8]) + (f" and {len(written) - 8} more" if len(written) > 8 else "")
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# combo of {len(members)} kernels with one body, one program per {COMBO_CONFIG.XBLOCK} elements "
                f"of a member; they write {shown}"]
    functions = [first.text.replace("def BODY(", f"def {body_name}(", 1), "\n".join(lines) + "\n"]
    source = first.kernel.module_source(functions, interpret, comments)
    return ComboKernelSource(
        name=name, source=source, member_buffers=[[buffer for _, buffer in m.pointers] for m in members],
        member_numels=[m.xnumel for m in members], pointers_per_member=len(params), config=COMBO_CONFIG,
        origins=origins)
