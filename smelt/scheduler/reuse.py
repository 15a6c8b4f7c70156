"""A kernel's result written over an input that dies with it (in-place reuse).

Eager allocates every op's result while its inputs are alive; so did smelt, and a chain of
activation-sized buffers (a convolution's output, its norm, its activation) met at the peak: ResNet-50's
bf16 inference peaked at 1.34x Inductor's on the H100. When a kernel stores a buffer that fits in the
memory of one it reads for the last time (of any shape: a linear layer's [M, N] product and its
activation as [B, H, W, N]), and reads that buffer only at the memory offset it writes, the wrapper
hands it the dying buffer's memory instead of a new one.

Only where that is safe on every backend:
- a kernel storing one result: no scan or scatter, no finisher, not a combo; in a reduction kernel,
  a value per element stored in the last pass over the rows, beside which it may store values per
  row (a final norm's statistics beside its normalized rows, written over the residual stream that
  dies in it: 18 MiB of ViT-Base's AMP training peak on the H200). Per-row values come from
  reductions finished before the last pass writes (Triton's passes; Halide stages every reduction
  of a kernel with several outputs at the root, before any output's loop) and load no element of
  the rows; a second value per element could (Halide computes each output in a loop of its own,
  recomputing inlined values from the inputs, perhaps after the rows overwrote them);
- the reused buffer loaded only at the store's own index (each element is read before the same
  program writes it, and by no other), by the node that writes the new one or, in a reduction
  kernel, by a member whose loads all come before the store (a softmax's max and sum over the
  scores it is written over);
- a buffer a kernel of this graph allocated, or a saved activation the backward owns (AOTAutograd
  donates it); never another graph input, an output, a slice of a shared storage, or an ATen result
  its op's schema lets alias an input; never a buffer an ATen call that may return a view of it
  reads (the view reads the memory later);
- no autotuning (its trials rerun the kernel on the same arguments).
"""
from __future__ import annotations

from ..ir.extern import returns_fresh_buffer
from ..symbolic import static_int
from .nodes import same
from .placement import Placement


def plan_reuse(steps, outputs: set[str], graph) -> dict[str, str]:
    """{buffer a kernel stores: the dying buffer whose memory it takes}."""
    buffers = {b.name: b for b in graph.buffers}
    owned = {name for s in steps if not s.is_extern and not s.combo for name in s.stored}  # wrapper-allocated
    owned |= {s.group.nodes[0].write_name for s in steps if s.is_extern and returns_fresh_buffer(s.group.nodes[0].buffer)}
    owned -= outputs | set(graph.constants) | set(graph.shared_storages)
    owned -= {name for name, _ in graph.inputs}
    # A recorded CUDA graph reads some inputs in place, from memory its other recordings own: not taken.
    if not getattr(graph.config, "cuda_graphs", False):
        donated = {name: value for name, value in graph.inputs if name in graph.donated_inputs}
        buffers.update(donated)
        owned |= set(donated) - outputs
    owned -= viewed_by_aten(steps)
    reuses: dict[str, str] = {}
    taken: set[str] = set()
    for step in steps:
        # One stored result, or per-row ones beside it: a second value per element (a float64 copy
        # beside a value) may be printed after the first's store, and Halide recomputes an inlined
        # value there, loading the reused buffer again.
        if step.is_extern or step.combo or step.finishers or not step.stored:
            continue
        plan = step.plan
        if any(n.is_scan or n.is_scatter for n in plan.nodes):
            continue
        if len(step.stored) > 1 and not plan.is_reduction:
            continue
        for out in step.stored:
            writer = plan.writer_of(out)
            if writer is None or not _plain(buffers.get(out)) or out in step.kept_in_input:
                continue
            if not _others_per_row(plan, out, step.stored):
                continue
            if plan.is_reduction and not _stored_in_the_last_pass(plan, writer):
                continue
            for src in step.frees:
                if src in taken or src not in owned or not _plain(buffers.get(src)) \
                        or not _fits_over(buffers[src].layout, buffers[out].layout) \
                        or not _read_in_place(plan, writer, src):
                    continue
                reuses[out] = src
                taken.add(src)
                break
    return reuses


def _stored_in_the_last_pass(plan, writer) -> bool:
    """In a reduction kernel: `writer` is an element of the rows, computed in the last pass over
    them, and no other member reads it (a reader in a later pass would compute it again, from memory
    already overwritten). A cross entropy's gradient over the saved logits is one: the reductions
    before it read other values."""
    return plan.placement[writer.name] == Placement.XR and plan.phase[writer.name] == plan.num_phases - 1 \
        and not any(writer.name in n.read_names for n in plan.nodes if n is not writer)


def _others_per_row(plan, out: str, stored: list[str]) -> bool:
    """Every result a reduction kernel stores besides `out` is one value per row (a reduction, or a
    value computed from reductions: a norm's mean and inverse deviation). None loads an element of
    the rows: `_read_in_place` requires every load of the reused buffer at the store's index, and
    the stored rows are values per element (`_stored_in_the_last_pass`), whose index moves along the
    row where a per-row value's cannot (a norm over rows of one element places every member per row,
    and takes no memory)."""
    for name in stored:
        writer = plan.writer_of(name)
        if name != out and (writer is None or plan.placement[writer.name] not in (Placement.X, Placement.REDUCTION)):
            return False
    return True


def _plain(buffer) -> bool:
    """A buffer with memory of its own under its own name."""
    return buffer is not None and getattr(buffer, "lives_in", None) is None and buffer.binds_name \
        and getattr(buffer, "storage_name", buffer.name) == buffer.name and buffer.layout is not None


def _fits_over(src, out) -> bool:
    """Whether `out` can live in `src`'s memory: the same element type, and every element of `out`
    within `src`'s storage. The shapes may differ (a product's [M, N] result and its activation viewed
    as [B, H, W, N]): `_read_in_place` compares memory offsets, not indices."""
    if (src.device, src.dtype, src.offset) != (out.device, out.dtype, out.offset):
        return False
    if (list(src.size), list(src.stride)) == (list(out.size), list(out.stride)):
        return True
    needed, held = static_int(out.storage_numel()), static_int(src.storage_numel())
    return src.offset == 0 and needed is not None and held is not None and needed <= held


def _read_in_place(plan, writer, src: str) -> bool:
    """Every load of `src` in the kernel is at the element `writer` stores, by a member that loads
    it before that store: the writer itself or, in a reduction kernel, one `_read_before_the_store`
    names. (In a pointwise kernel another member could be printed after the store and load the
    element already overwritten.)"""
    x, r = plan.xnumel, plan.rnumel
    store = writer.store_index(plan.placement[writer.name], x, r)
    before = _read_before_the_store(plan, writer) if plan.is_reduction else set()
    found = False
    for node in plan.nodes:
        for name, index in node.reads_in_kernel(plan.placement[node.name], x, r):
            if name != src:
                continue
            if not same(index, store) or (node is not writer and node.name not in before):
                return False
            found = True
    return found


def _read_before_the_store(plan, writer) -> set[str]:
    """In a reduction kernel storing `writer` in its last pass: the members whose loads of the
    writer's elements all come before the store. A softmax over a product's scores is the case:
    its max and sum read each score in the passes before the one writing the probabilities over
    them. A member of an earlier pass finishes that pass over the row before the last pass starts
    (a persistent kernel: the stored value depends on every element the reductions read); one of
    the last pass must be an input of the writer, computed before it in that pass. Every member of
    the last pass must be, or a later one could recompute an earlier pass's value from memory
    already overwritten: then none is named."""
    last = plan.num_phases - 1
    writers = {n.write_name: n for n in plan.nodes}
    inputs, stack = set(), [writer]
    while stack:
        for name in stack.pop().read_names:
            producer = writers.get(name)
            if producer is not None and producer.name not in inputs and producer is not writer:
                inputs.add(producer.name)
                stack.append(producer)
    # A value per row of the last pass (a norm's statistics, stored beside its rows) loads no
    # element of the rows: it recomputes nothing from them.
    if any(plan.phase[n.name] == last and n is not writer and n.name not in inputs
           and plan.placement[n.name] != Placement.X for n in plan.nodes):
        return set()
    return inputs | {n.name for n in plan.nodes if plan.phase[n.name] < last}


def viewed_by_aten(steps) -> set[str]:
    """Buffers an ATen call reads whose result may be a view of its inputs (or that writes into
    one): such a view reads the buffer's memory after the buffer's own last reader."""
    found: set[str] = set()
    for step in steps:
        if not step.is_extern:
            continue
        node = step.group.nodes[0]
        if not returns_fresh_buffer(node.buffer):
            found |= set(node.read_names)
    return found
