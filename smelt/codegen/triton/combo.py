"""One launch for many independent kernels (scheduler/combo.py gathers them).

Each kind of member (one generated body, its dtypes and its block sizes) is generated once, as a
function of its buffers' pointers, sizes and the block it runs. The launched kernel reads, per
program, the kind, where its member's pointers and sizes start in a pointer table, and which
block of the member to run, from a work table; a chain of ifs on the kind picks the body:

    kind, slots, block = work[pid]
    if kind == 0:
        in_ptr0, ..., xnumel = table[slots:]
        body0(in_ptr0, ..., xnumel, block, XBLOCK)
    elif kind == 1:
        in_ptr0, ..., xnumel, rnumel = table[slots:]
        body1(in_ptr0, ..., xnumel, rnumel, block, 1, 2048)
    ...

Each pointer loaded from the table is marked 16-byte aligned when the launch's POINTER_ALIGN is 16
(a binary the launcher uses only where every buffer of the call is aligned), and a size every member
of a kind has as a multiple of 16 is marked so: without both Triton cannot prove a block's loads
whole vectors and moves bf16 two bytes at a time (Whisper's key / value transposes as one combo took
15.4 us on the H200, two separate kernels 4.7 each).

So the kernel's source, and its compile, grow with the kinds, not with the members: an Adam step
over 150 parameters is one compile of one Adam body. A CPU scalar that GPU kernels take by value
(Target.host_scalar_args: a learning rate passed as a tensor, so that a scheduler's changes do not
recompile) is an argument of the launch, passed to each body that reads it; only members reading
the same such scalars share a launch. Members are pointwise kernels over a flat
range or reductions whose rows one program each finishes (not tiled, not split across programs,
no scans), with static sizes. A reduction kind keeps the block sizes the member would have alone
(a small norm's RBLOCK is not a big one's); pointwise kinds share the launch's XBLOCK, a constexpr
that autotuning may change together with num_warps (the combo is timed as a whole). A body is
generated with its masks on, since member sizes differ. The launcher
(runtime/combo_launcher.py) builds both tables.
"""
from __future__ import annotations

import collections
import dataclasses
import math

from ...artifact import BlockConfig
from ...scheduler.combo import with_a_possible_partner
from ...scheduler.schedule import Step
from ...symbolic import static_int
from .candidates import combo_candidates
from .kernel import TritonKernel, choose_blocks, index_dtype_for
from .ops import triton_type

# Every pointwise member runs in blocks of this many elements: big enough for wide loads, and a
# tiny member wastes only masked lanes of one block.
POINTWISE_CONFIG = BlockConfig(XBLOCK=1024, RBLOCK=None, num_warps=4, persistent=False)
# A kernel of at most this many elements is launch-bound on a GPU (a launch costs what moving a few
# MB does): it may share a launch with kernels of other bodies even when no kernel shares its own.
# A bigger one joins only kernels of its outline, as an optimizer's parameters do.
SMALL = 1 << 16
# A combo over at most this many elements is launch-bound (a few microseconds of bandwidth): it is
# not autotuned.
TUNE_MIN_ELEMENTS = 1 << 20


@dataclasses.dataclass
class MemberBody:
    """One combinable kernel, generated as a body function: its text is the combo key."""

    kernel: TritonKernel
    text: str
    pointers: list[tuple[str, str]]  # (parameter, buffer), in the body's order
    written: tuple[int, ...]  # which of the pointers the body stores through
    sizes: tuple[int, ...]  # (xnumel,) or, for a reduction, (xnumel, rnumel)
    config: BlockConfig
    scalars: tuple[str, ...] = ()  # the host scalars it takes by value (their wrapper names), in its order

    def kind(self, graph) -> tuple:
        """What members of one branch share: the body, its buffers' dtypes, its block sizes."""
        dtypes = tuple(graph.dtype_of(buffer) for _, buffer in self.pointers)
        return self.text, dtypes, (self.config.XBLOCK, self.config.RBLOCK, self.config.persistent)


class ComboBodies:
    """Generates each candidate step's body once; `key` is what scheduler/combo.py groups by."""

    def __init__(self, graph, interpret_for, eviction_hints: bool, persistent_limit: int, steps: list[Step]):
        self.graph = graph
        self.interpret_for = interpret_for  # step -> whether its kernel is interpreted
        self.eviction_hints = eviction_hints
        self.persistent_limit = persistent_limit
        self.bodies: dict[int, MemberBody] = {}
        # Only a step whose outline another step shares can have its body: the others are not
        # generated twice (once here, once as their own kernel).
        counts = collections.Counter(_outline(s) for s in steps if not s.is_extern)
        self.shared = {outline for outline, n in counts.items() if n > 1}
        self.steps = steps
        self._partnered: set[int] | None = None

    def alike(self, step: Step) -> bool:
        """Whether another step surely shares this one's body (its outline)."""
        return _outline(step) in self.shared

    def key(self, step: Step):
        """(which launches the step may share, its kind), as scheduler/combo.py takes them; None
        for a step never combined."""
        if self._partnered is None:
            self._partnered = with_a_possible_partner(self.steps, self._family)
        if id(step) not in self._partnered:  # every step it could share a launch with is ordered with it
            return None
        elements = _elements(step)
        small = bool(elements and elements <= SMALL)
        body = self.body(step)
        if body is None:
            return None
        launch = (str(step.group.nodes[0].buffer.get_device()), self.interpret_for(step), tuple(sorted(body.scalars)))
        kind = body.kind(self.graph)
        # A launch runs every member at its widest member's registers and one num_warps: a Qwen2
        # norm's persistent row reduction and its weight's column sum took 90 us together, 65 apart.
        return (launch if small else (*launch, kind)), kind

    def _family(self, step: Step):
        """What a step's key surely shares with another's: small steps may share any launch on
        their device; a bigger one only one of its outline."""
        if step.is_extern:
            return None
        elements = _elements(step)
        if elements and elements <= SMALL:
            return "small", str(step.group.nodes[0].buffer.get_device()), self.interpret_for(step)
        outline = _outline(step)
        return ("outline", outline) if outline in self.shared else None

    def body(self, step: Step) -> MemberBody | None:
        if id(step) in self.bodies:
            return self.bodies[id(step)]
        self.bodies[id(step)] = body = self._generate(step)
        return body

    def _generate(self, step: Step) -> MemberBody | None:
        group = step.group
        if not _elements(step) or any(n.is_scatter for n in group.nodes):
            return None
        plan = step.plan
        if plan.tiling is not None or not plan.stored or plan.has_scan:
            return None
        interpret = self.interpret_for(step)
        if plan.is_reduction:
            config = choose_blocks(plan, interpret, self.persistent_limit)
            if config.row_split > 1:  # its programs meet through a workspace of their own
                return None
            sizes = (static_int(group.xnumel), static_int(group.rnumel))
        else:
            config, sizes = POINTWISE_CONFIG, (static_int(group.xnumel),)
        kernel = TritonKernel(plan, config, self.graph, index_dtype_for(plan, self.graph), interpret,
                              masks=(True, plan.is_reduction), eviction_hints=self.eviction_hints, program_arg=True)
        text = kernel.function_source("BODY")
        pointers, named_sizes = kernel.launch_args()
        host_scalars = set(self.graph.host_scalars.values())
        if any(name not in host_scalars for name in named_sizes):  # a size passed by name would differ between members
            return None
        written = tuple(j for j, (_, buffer) in enumerate(pointers) if buffer in kernel.args.outputs)
        return MemberBody(kernel, text, pointers, written, sizes, config, tuple(named_sizes))


def _elements(step: Step) -> int | None:
    """The elements the step's kernel iterates over, when static."""
    xn = static_int(step.group.xnumel)
    if not step.group.is_reduction:
        return xn
    rn = static_int(step.group.rnumel)
    return xn * rn if xn and rn is not None else None


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
    member_sizes: list[tuple[int, ...]]
    member_kinds: list[int]
    pointers_per_kind: list[int]
    xblock_per_kind: list[int]  # a reduction kind's own; 0 for a pointwise kind (the launch's XBLOCK)
    written_per_kind: list[tuple[int, ...]]  # the pointers each kind stores through
    scalars: list[str]  # the host scalars the launch passes after its buffers (their wrapper names)
    config: BlockConfig  # the launch's: its warps and its pointwise kinds' XBLOCK
    candidates: list[BlockConfig]  # more than one: timed as a whole on the first launch
    origins: list[str]

    @property
    def launch(self) -> tuple:
        """What runtime/combo_launcher.py takes besides the kernel: each member's sizes and kind,
        each kind's pointers, XBLOCK and written pointers, and how many host scalars follow the buffers."""
        return (tuple(self.member_sizes), tuple(self.member_kinds), tuple(self.pointers_per_kind),
                tuple(self.xblock_per_kind), tuple(self.written_per_kind), len(self.scalars))

    @property
    def size_args(self) -> list[str]:
        """The wrapper's values the launch takes after its buffers (codegen/wrapper.py binds them)."""
        return self.scalars


def combo_kernel(step: Step, bodies: ComboBodies, graph, interpret: bool, index: int,
                 autotune: bool = False) -> ComboKernelSource:
    members = [bodies.body(m) for m in step.combo]
    keys = [m.kind(graph) for m in members]
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
    # One function per distinct text: kinds that differ only in dtypes or block sizes call it with
    # their own pointers and constants, and Triton specializes it for each.
    texts: dict[str, str] = {}
    for body in kind_bodies:
        texts.setdefault(body.text, f"{name}_body{len(texts)}")
    if len(texts) == 1:
        texts = {text: f"{name}_body" for text in texts}
    several = len(kind_bodies) > 1
    # The key gave every member the same host scalars (scheduler/combo.py groups by it).
    scalars = sorted({s for m in members for s in m.scalars})
    typed = "".join(f"{s}: tl.float64, " for s in scalars)
    lines = [
        "",
        "@triton.jit",
        f"def {name}(work_ptr, table_ptr, {typed}XBLOCK: tl.constexpr, POINTER_ALIGN: tl.constexpr):",
        "    # This program's kind of member, where its member's buffers and sizes are listed and",
        "    # which block of it to run (work table). POINTER_ALIGN: 16 where every buffer of the",
        "    # launch is 16-byte aligned (the launcher picks the binary), so loads may be vectorized.",
        "    row = work_ptr + 3 * tl.program_id(0)",
        "    kind = tl.load(row)",
        "    slots = table_ptr + tl.load(row + 1)",
        "    block = tl.load(row + 2)",
    ]
    for k, body in enumerate(kind_bodies):
        indent = "    "
        if several:
            lines.append(f"    {'if' if k == 0 else 'elif'} kind == {k}:")
            indent = "        "
        # Named apart per kind: Triton rejects a name bound to two pointer types in two branches.
        params = [f"{p}_{k}" if several else p for p, _ in body.pointers]
        for j, (param, (_, buffer)) in enumerate(zip(params, body.pointers)):
            pointer = f"tl.pointer_type({triton_type(graph.dtype_of(buffer))})"
            lines.append(f"{indent}{param} = tl.multiple_of(tl.load(slots + {j}).to({pointer}), POINTER_ALIGN)")
        size_names = ["xnumel", "rnumel"][:len(body.sizes)]
        kind_sizes = [m.sizes for m, key in zip(members, member_kinds) if key == k]
        for j, size in enumerate(size_names):
            load = f"tl.load(slots + {len(params) + j})"
            if all(sizes[j] % 16 == 0 for sizes in kind_sizes):  # masks of whole vectors
                load = f"tl.multiple_of({load}, 16)"
            lines.append(f"{indent}{size} = {load}")
        blocks = ([str(body.config.XBLOCK), str(body.config.RBLOCK)] if body.config.RBLOCK is not None
                  else ["XBLOCK"])
        arguments = params + list(body.scalars) + size_names + ["block"] + blocks
        lines.append(f"{indent}{texts[body.text]}({', '.join(arguments)})")
    config = BlockConfig(XBLOCK=POINTWISE_CONFIG.XBLOCK, RBLOCK=None,
                         num_warps=max(b.config.num_warps for b in kind_bodies), persistent=False)
    pointwise = [m.sizes[0] for m in members if len(m.sizes) == 1]
    elements = sum(math.prod(m.sizes) for m in members)
    # A launch this small costs what launching costs, whatever its config: not worth timing.
    tuned = autotune and elements > TUNE_MIN_ELEMENTS
    candidates = combo_candidates(config, max(pointwise, default=0)) if tuned else [config]
    written = [m.stored[0] for m in step.combo if m.stored]
    shown = ", ".join(written[:8]) + (f" and {len(written) - 8} more" if len(written) > 8 else "")
    described = "; ".join(f"kind {k}: {_blocks_text(b)}" for k, b in enumerate(kind_bodies)) if several \
        else _blocks_text(kind_bodies[0])
    comments = [f"# aten ops: {', '.join(origins)}",
                f"# combo of {len(members)} kernels of {len(kind_bodies)} kind(s), one program per block of a member "
                f"({described}); they write {shown}",
                f"# launch: XBLOCK={config.XBLOCK} num_warps={config.num_warps}"
                + (f"; autotuned over {len(candidates)} configs" if len(candidates) > 1 else "")]
    functions = [b.text.replace("def BODY(", f"def {texts[b.text]}(", 1)
                 for b in {b.text: b for b in kind_bodies}.values()]
    functions.append("\n".join(lines) + "\n")
    first = kind_bodies[0]
    source = first.kernel.module_source(functions, interpret, comments, also=tuple(b.kernel for b in kind_bodies[1:]))
    return ComboKernelSource(
        name=name, source=source, member_buffers=[[buffer for _, buffer in m.pointers] for m in members],
        member_sizes=[m.sizes for m in members], member_kinds=member_kinds,
        pointers_per_kind=[len(b.pointers) for b in kind_bodies],
        xblock_per_kind=[b.config.XBLOCK if b.config.RBLOCK is not None else 0 for b in kind_bodies],
        written_per_kind=[b.written for b in kind_bodies], scalars=scalars, config=config, candidates=candidates,
        origins=origins)


def _blocks_text(body: MemberBody) -> str:
    c = body.config
    if c.RBLOCK is None:
        return "XBLOCK of the launch"
    return f"XBLOCK={c.XBLOCK} RBLOCK={c.RBLOCK}{' persistent' if c.persistent else ''}"
