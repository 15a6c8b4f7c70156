"""Values an inference graph computes from weights alone, computed once and kept (SMELT_FREEZE_WEIGHTS).

Every call of a compiled inference graph redoes work that depends on the module's parameters and
buffers only: a convolution weight copied to channels-last (oneDNN and cuDNN convert an NCHW weight
inside each call: 3.2 ms of ResNet-18's 40 on the 2-core CPU), an autocast's cast of each weight to
bfloat16. With the setting on, such copies move out of the graph into a prologue, an FX graph of
ATen calls run eagerly; the graph takes their results as extra inputs. The prologue runs at the
first call and again only when a weight it reads has moved (another storage) or been changed in
place (its version counter), so an optimizer step under `no_grad` or `load_state_dict` is seen. A
change that goes around the version counter (`param.data.copy_(...)`) is not: hence opt-in.

Only copies that convert (a dtype, a device, strides) are moved, with the views between them: a view costs nothing
per call, and a constant holding one would keep its base alive. A copy the graph returns stays (the
caller may write into it); a weight the graph writes into (a batch norm's running statistics in
training mode) is not frozen.
"""
from __future__ import annotations

import logging
import weakref

import torch
import torch.fx

from .layout_plan import channels_last_weight_copies

aten, prims = torch.ops.aten, torch.ops.prims
log = logging.getLogger("smelt.lowering")

_COPIES = {aten.clone.default, aten._to_copy.default, prims.convert_element_type.default,
           aten.contiguous.default}
_VIEWS = {aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
          aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
          aten.alias.default}


def weight_indices(example_inputs) -> list[int]:
    """Positions of the Dynamo graph's inputs that are a module's parameters or buffers: Dynamo marks
    those of the modules it inlines as unguarded static inputs (a tensor a user marks static, such as
    a KV cache, is guarded by default: not taken)."""
    return [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and (
        isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) == "unguarded")]


class FoldedWeights:
    """The prologue and where its inputs sit among the graph's; wraps the compiled graph's call."""

    def __init__(self, prologue: torch.fx.GraphModule, indices: list[int], names: list[str]):
        self.prologue = prologue
        self.indices = indices  # the weights the prologue reads, by position among the graph's inputs
        self.names = names  # the values it makes, in the order the graph takes them after its own inputs
        self.key = None
        self.held: list[weakref.ref] = []  # the weights the values were made from
        self.values: list[torch.Tensor] = []
        self.runs = 0  # how many times the prologue ran (tests)

    def wrap(self, call):
        def call_with_folded_weights(args: list):
            weights = [args[i] for i in self.indices]
            # Each weight's storage and version counter, and the tensor itself: a new tensor may
            # land on a dead one's memory with the same version.
            key = tuple((w.untyped_storage().data_ptr(), w._version) for w in weights)
            if key != self.key or any(r() is not w for r, w in zip(self.held, weights)):
                with torch.no_grad():
                    self.values = list(self.prologue(*weights))
                self.held = [weakref.ref(w) for w in weights]
                self.key = key
                self.runs += 1
            full = args + self.values
            args.clear()
            return call(full)
        return call_with_folded_weights


def fold_weights(gm: torch.fx.GraphModule, weights: list[int], wants_channels_last) -> FoldedWeights | None:
    """Moves what `gm` computes from its inputs at `weights` alone into a prologue (see the module
    docstring); `wants_channels_last(device)` as the layout plan takes it. None: nothing to move."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    if meta is None or meta.tokens or len(meta.input_info) != len(placeholders):
        return None  # which inputs the graph mutates is not known here: nothing is frozen
    frozen = {placeholders[i] for i in weights if i < len(placeholders)
              and not (meta.input_info[i].mutates_data or meta.input_info[i].mutates_metadata)}
    if not frozen:
        return None
    output = gm.graph.find_nodes(op="output")[0]
    foldable = _foldable(gm, frozen, output)
    # A convolution weight the graph reads as it is, or casts first (autocast), gets its channels-last
    # copy here, where it can move too.
    if channels_last_weight_copies(gm, wants_channels_last, foldable):
        foldable = _foldable(gm, frozen, output)

    def read_by_graph(node) -> bool:  # after the move: by a node left in the graph, or through a view left there
        return any(u not in foldable or (u.target in _VIEWS and read_by_graph(u)) for u in node.users)
    moved = [n for n in gm.graph.nodes if n in foldable and n not in frozen and n.target in _COPIES
             and read_by_graph(n) and _converts(n)]
    if not moved:
        return None
    prologue, inputs = _prologue(gm, moved, frozen)
    index_of = {p: i for i, p in enumerate(placeholders)}
    last = placeholders[-1]
    names = []
    for node in moved:
        with gm.graph.inserting_after(last):
            folded = gm.graph.placeholder(f"folded_{node.name}")
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
        last = folded
        names.append(folded.name)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    log.debug("smelt: %d values computed from weights alone move to a prologue (%s)", len(moved),
              ", ".join(str(n.target) for n in moved[:4]))
    return FoldedWeights(prologue, [index_of[p] for p in inputs], names)


def _foldable(gm: torch.fx.GraphModule, frozen: set, output: torch.fx.Node) -> set:
    """The frozen inputs and the copies and views computed from them alone (a copy the graph returns
    excepted)."""
    foldable = set(frozen)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (_COPIES | _VIEWS) and node.all_input_nodes \
                and all(a in foldable for a in node.all_input_nodes) \
                and not (node.target in _COPIES and _returned(node, output)):
            foldable.add(node)
    return foldable


def _converts(copy: torch.fx.Node) -> bool:
    """Whether a copy changes its input's dtype, device or strides: one that does not (a batch norm's
    statistics cast to the dtype they have) is fused into its reader's kernel at no cost, and moved
    would only add an input to check on every call."""
    val, source = copy.meta.get("val"), copy.args[0].meta.get("val")
    if not (isinstance(val, torch.Tensor) and isinstance(source, torch.Tensor)):
        return True
    return (val.dtype, val.device, val.stride()) != (source.dtype, source.device, source.stride())


def _returned(node: torch.fx.Node, output: torch.fx.Node) -> bool:
    """Whether the graph returns `node` or a view of it: the caller may write into what it gets."""
    return any(u is output or (u.op == "call_function" and u.target in _VIEWS and _returned(u, output))
               for u in node.users)


def _prologue(gm: torch.fx.GraphModule, moved: list[torch.fx.Node], frozen: set):
    """An FX graph computing `moved` from the weights they read; returns it and those weights."""
    needed: set[torch.fx.Node] = set()
    stack = list(moved)
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        stack += node.all_input_nodes
    graph, env = torch.fx.Graph(), {}
    inputs = [n for n in gm.graph.nodes if n in needed and n in frozen]
    for node in inputs:
        env[node] = graph.placeholder(node.name)
    for node in gm.graph.nodes:
        if node in needed and node not in frozen:
            env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[n] for n in moved))
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs

