"""One launch for many independent kernels (scheduler/combo.py gathers them).

Each kind of member (one generated body) is generated once, as a function of its buffers'
pointers, xnumel and the block it runs. The launched kernel reads, per program, the kind, where
its member's pointers and element count start in a pointer table, and which block of the member
to run, from a work table; a chain of ifs on the kind picks the body:

    kind, slots, block = work[pid]
    if kind == 0:
        in_ptr0, ..., xnumel = table[slots:]
        body0(in_ptr0, ..., xnumel, block)
    elif kind == 1: ...

So the kernel's source, and its compile, grow with the kinds, not with the members: an Adam step
over 150 parameters is one compile of one Adam body. Members are kernels over a flat range
(pointwise, not tiled) with static sizes; a body is generated with its mask on, since member
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
# A kernel of at most this many elements is launch-bound on a GPU (a launch costs what moving a few
# MB does): it may share a launch with kernels of other bodies even when no kernel shares its own.
# A bigger one joins only kernels of its outline, as an optimizer's parameters do.
SMALL = 1 << 16


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
        """(which launches the step may share, its kind), as scheduler/combo.py takes them; None
        for a step never combined."""
        xn = static_int(step.group.xnumel)
        if _outline(step) not in self.shared and not (xn and xn <= SMALL):
            return None
        body = self.body(step)
        if body is None:
            return None
        dtypes = tuple(self.graph.dtype_of(buffer) for _, buffer in body.pointers)
        return (str(step.group.nodes[0].buffer.get_device()), self.interpret_for(step)), (body.text, dtypes)

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
    member_kinds: list[int]
    pointers_per_kind: list[int]
    config: BlockConfig
    origins: list[str]

    @property
    def launch(self) -> tuple:
        """What runtime/combo_launcher.py takes besides the kernel: numels, kinds, pointers per kind."""
        return tuple(self.member_numels), tuple(self.member_kinds), tuple(self.pointers_per_kind)


def combo_kernel(step: Step, bodies: ComboBodies, graph, interpret: bool, index: int) -> ComboKernelSource:
    members = [bodies.body(m) for m in step.combo]
    keys = [(m.text, tuple(graph.dtype_of(buffer) for _, buffer in m.pointers)) for m in members]
    kinds: dict[tuple, int] = {}
    kind_bodies: list[MemberBody] = []
    for key, m in zip(keys, members):
        if key not in kinds:
            kinds[key] = len(kind_bodies)
            kind_bodies.append(m)
    member_kinds = [kinds[key] for key in keys]
    origins = sorted({o for m in step.combo for n in m.group.nodes for o in n.buffer.origins})
    ops = sorted({o.split(".")[1].strip("_") for o in origins if o.count(".") >= 1})
    name = f"triton_combo_{'_'.join([o for o in ops if o][:5]) or 'copy'}_{index}"
    several = len(kind_bodies) > 1
    body_names = [f"{name}_body{k}" if several else f"{name}_body" for k in range(len(kind_bodies))]
    lines = [
        "",
        "@triton.jit",
        f"def {name}(work_ptr, table_ptr, XBLOCK: tl.constexpr):",
        "    # This program's kind of member, where its member's buffers are listed and which block",
        "    # of it to run (work table).",
        "    row = work_ptr + 3 * tl.program_id(0)",
        "    kind = tl.load(row)",
        "    slots = table_ptr + tl.load(row + 1)",
        "    block = tl.load(row + 2)",
    ]
    for k, (body, body_name) in enumerate(zip(kind_bodies, body_names)):
        indent = "    "
        if several:
            lines.append(f"    {'if' if k == 0 else 'elif'} kind == {k}:")
            indent = "        "
        # Named apart per kind: Triton rejects a name bound to two pointer types in two branches.
        params = [f"{p}_{k}" if several else p for p, _ in body.pointers]
        for j, (param, (_, buffer)) in enumerate(zip(params, body.pointers)):
            pointer = f"tl.pointer_type({triton_type(graph.dtype_of(buffer))})"
            lines.append(f"{indent}{param} = tl.load(slots + {j}).to({pointer})")
        lines.append(f"{indent}xnumel = tl.load(slots + {len(params)})")
        lines.append(f"{indent}{body_name}({', '.join(params)}, xnumel, block, XBLOCK)")
    written = [m.stored[0] for m in step.combo if m.stored]
    shown = ", ".join(written[:8]) + (f" and {len(written) - 8} more" if len(written) > 8 else "")
    bodies_text = f"{len(kind_bodies)} bodies" if several else "one body"
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# combo of {len(members)} kernels with {bodies_text}, one program per {COMBO_CONFIG.XBLOCK} elements "
                f"of a member; they write {shown}"]
    functions = [b.text.replace("def BODY(", f"def {n}(", 1) for b, n in zip(kind_bodies, body_names)]
    functions.append("\n".join(lines) + "\n")
    first = kind_bodies[0]
    source = first.kernel.module_source(functions, interpret, comments, also=tuple(b.kernel for b in kind_bodies[1:]))
    return ComboKernelSource(
        name=name, source=source, member_buffers=[[buffer for _, buffer in m.pointers] for m in members],
        member_numels=[m.xnumel for m in members], member_kinds=member_kinds,
        pointers_per_kind=[len(b.pointers) for b in kind_bodies], config=COMBO_CONFIG, origins=origins)
