"""The Dynamo level of the graph cache for training graphs: a Dynamo graph that AOTAutograd split
into a forward and a backward ATen graph runs, on a hit, through smelt's own autograd.Function over
the two cached graphs, so a warm start skips AOTAutograd's joint trace and partition.

What AOTAutograd's autograd.Function does for a graph is read off its metadata and the two graphs
while the first process compiles them (`describe`), and a graph qualifies only where that is all of
it: the forward returns the user's outputs, then the tensors it saves for the backward, then the
sizes it saves; the backward takes the sizes, the tensors, then one gradient for each output that
requires grad, and returns one gradient (or None) for each input. Outputs that do not require grad
are marked non-differentiable; incoming gradients are given the layout the backward was traced for;
inputs whose gradient is always None and that are not leaves are detached; outputs that view an
input (or are one) are made again from it after the call, outputs that view the graph's own
intermediate go through `_unsafe_view`: all as AOTAutograd does. Anything else (inputs mutated
outside the graph, outputs aliasing each other or an intermediate, views of an input whose
elements share memory, effect tokens, functionalized RNG, tensor subclasses, saved values of other
kinds) compiles as usual.

The layout is a small JSON record (`TrainingLayout`), so nothing of AOTAutograd's private
structures is stored: those differ between torch 2.11 and 2.13, the graphs' calling convention
does not.
"""
from __future__ import annotations

import dataclasses

import torch

from ..runtime.compiled_graph import separate_copy
from .fingerprint import Uncacheable

# AOTAutograd's output types: outputs the autograd.Function returns, and outputs it makes again from
# an input after the call (a view of it, or the input itself).
PLAIN = ("non_alias", "unsafe_view_alias")
INPUT_ALIASES = ("alias_of_input", "is_input")


@dataclasses.dataclass
class TrainingLayout:
    num_outputs: int  # the user's outputs, first among the forward's
    differentiable: list[int]  # the outputs that require grad: one backward tangent each, in order
    num_saved_tensors: int  # then the tensors the forward saves
    num_saved_sizes: int  # then the sizes it saves (graphs of symbolic sizes)
    tangents: list  # each tangent's traced layout: "contiguous", "channels_last" or its strides
    detach: list[int]  # inputs detached before the call (non-leaves whose gradient is None)
    donated: list[int]  # the backward's arguments it writes over (saved tensors read last there)
    deterministic: bool | None  # torch.are_deterministic_algorithms_enabled() when traced
    unsafe_views: list[int]  # outputs that are views of an intermediate: returned as plain tensors
    aliases: list[list]  # [output, input, whether it is the input itself, requires grad]: made from the input

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, body: dict) -> "TrainingLayout":
        layout = cls(**body)
        if not all(isinstance(v, int) for v in
                   (layout.num_outputs, layout.num_saved_tensors, layout.num_saved_sizes, *layout.differentiable,
                    *layout.detach, *layout.donated, *layout.unsafe_views, *(v for a in layout.aliases for v in a))) \
                or any(len(a) != 4 for a in layout.aliases) or len(layout.tangents) != len(layout.differentiable):
            raise TypeError("a training layout of the wrong form")
        return layout


def check_forward(meta, fw_gm: torch.fx.GraphModule, num_inputs: int, num_outputs: int) -> None:
    """Raises Uncacheable unless AOTAutograd's wrapper around this forward does only what
    TrainingGraph does."""
    if meta is None:
        raise Uncacheable("AOTAutograd's metadata is not available")
    if any(i.mutates_metadata or getattr(i, "mutates_storage_metadata", False) for i in meta.input_info):
        raise Uncacheable("it changes an input's shape or strides")
    if meta.mutated_inp_runtime_indices:
        raise Uncacheable("it mutates an input outside the graph")
    input_aliases(meta, fw_gm)
    if meta.num_intermediate_bases or getattr(meta, "tokens", None) or getattr(meta, "num_graphsafe_rng_states", 0) \
            or getattr(meta, "is_rng_op_functionalized", False):
        raise Uncacheable("AOTAutograd adds outputs, effect tokens or RNG state")
    if getattr(meta, "grad_enabled_mutation", None) is not None:
        raise Uncacheable("it changes grad mode")
    if getattr(meta, "num_tensors_saved_with_no_vc_check", None):
        raise Uncacheable("it saves tensors outside autograd's version checks")
    if any(type(m).__name__ == "SubclassCreationMeta"
           for m in [*getattr(meta, "subclass_inp_meta", []), *getattr(meta, "subclass_fw_graph_out_meta", [])]):
        raise Uncacheable("it involves tensor subclasses")
    if len(list(fw_gm.graph.find_nodes(op="placeholder"))) != num_inputs or len(meta.output_info) != num_outputs \
            or meta.num_forward != num_outputs:
        raise Uncacheable("AOTAutograd changed the inputs or outputs")
    if not all(issubclass(o.raw_type, torch.Tensor) for o in meta.output_info):
        raise Uncacheable("an output is not a tensor")


def saved_kinds(fw_gm: torch.fx.GraphModule, num_outputs: int) -> tuple[int, int]:
    """How many tensors, then sizes, the forward saves for the backward (after the user's outputs)."""
    kinds = [_kind(v) for v in _output_values(fw_gm)[num_outputs:]]
    num_tensors = kinds.count("tensor")
    if kinds != ["tensor"] * num_tensors + ["size"] * (len(kinds) - num_tensors):
        raise Uncacheable("the forward saves values other than tensors then sizes")
    return num_tensors, len(kinds) - num_tensors


def describe(meta, saved: tuple[int, int], bw_gm: torch.fx.GraphModule, num_outputs: int) -> TrainingLayout:
    """The layout of a forward and backward pair (raises Uncacheable where it is not the plain one)."""
    num_tensors, num_sizes = saved
    num_saved = num_tensors + num_sizes
    placeholders = list(bw_gm.graph.find_nodes(op="placeholder"))
    is_tangent = [p.name.startswith("tangents") for p in placeholders]
    num_tangents = sum(is_tangent)
    if len(placeholders) != num_saved + num_tangents or any(is_tangent[:num_saved]) \
            or [_kind(p) for p in placeholders[:num_saved]] != ["size"] * num_sizes + ["tensor"] * num_tensors:
        raise Uncacheable("the backward does not take the saved sizes, the saved tensors, then the tangents")
    donated = bw_gm.meta.get("smelt_donated_inputs") or ()
    differentiable = [i for i, o in enumerate(meta.output_info) if o.output_type.name in PLAIN
                      and getattr(o, "requires_grad_for_backward", o.requires_grad)]
    if len(differentiable) != num_tangents:
        raise Uncacheable("the backward's tangents are not one for each output that requires grad")
    grads = _output_values(bw_gm)
    if len(grads) != len(meta.input_info):
        raise Uncacheable("the backward does not return one gradient for each input")
    detach = [i for i, (info, grad) in enumerate(zip(meta.input_info, grads))
              if grad is None and info.requires_grad and not getattr(info, "is_leaf", True)]
    return TrainingLayout(
        num_outputs=num_outputs, differentiable=differentiable, num_saved_tensors=num_tensors,
        num_saved_sizes=num_sizes, tangents=[_tangent_layout(p.meta.get("val")) for p in placeholders[num_saved:]],
        detach=detach, donated=[i for i, p in enumerate(placeholders) if p.name in donated],
        deterministic=getattr(meta, "deterministic", None),
        unsafe_views=[i for i, o in enumerate(meta.output_info) if o.output_type.name == "unsafe_view_alias"],
        aliases=input_aliases(meta, None))


def input_aliases(meta, gm: torch.fx.GraphModule | None) -> list[list]:
    """[output, input, whether it is the input itself, whether it requires grad] for each output
    aliasing an input; raises Uncacheable for outputs aliasing anything else, and (given the ATen
    graph) for a view of an input as another dtype."""
    if any(o.output_type.name not in PLAIN + INPUT_ALIASES for o in meta.output_info):
        raise Uncacheable("an output aliases another output or an intermediate")
    aliases = [[i, o.base_idx, o.output_type.name == "is_input", bool(o.requires_grad)]
               for i, o in enumerate(meta.output_info) if o.output_type.name in INPUT_ALIASES]
    if gm is not None and aliases:
        inputs = [p.meta.get("val") for p in gm.graph.find_nodes(op="placeholder")]
        values = _output_values(gm)
        for i, base, _, _ in aliases:
            value, source = _value_of(values[i]), inputs[base] if 0 <= base < len(inputs) else None
            if not isinstance(source, torch.Tensor) or not isinstance(value, torch.Tensor) \
                    or value.dtype != source.dtype or value.is_complex():
                raise Uncacheable("an output views an input as another dtype")
            # as_strided's gradient treats an input's elements that share memory (an expanded
            # input) as one: eager's view ops keep them apart.
            if torch._debug_has_internal_overlap(source) != 0:
                raise Uncacheable("an output views an input whose elements share memory")
    return aliases


def made_again(outputs: list, inputs: list, aliases: list[list]) -> list:
    """An inference graph's outputs with those aliasing an input made again from it."""
    by_output = {a[0]: a[1:] for a in aliases}
    return [_alias_of(inputs, o, *by_output[i]) if i in by_output else o for i, o in enumerate(outputs)]


def _output_values(gm: torch.fx.GraphModule) -> list:
    output = next(iter(reversed(gm.graph.find_nodes(op="output"))))
    values = output.args[0]
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _value_of(value):
    """A graph value's example (a node's "val")."""
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def _kind(value) -> str:
    value = _value_of(value)
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        return "size"
    return type(value).__name__


def _tangent_layout(val):
    if not isinstance(val, torch.Tensor):
        raise Uncacheable("a tangent is not a tensor")
    if val.is_contiguous():
        return "contiguous"
    if val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    strides = val.stride()
    if not all(isinstance(s, int) for s in strides):
        raise Uncacheable("a tangent of symbolic strides in neither contiguous nor channels-last order")
    return list(strides)


def _coerced(grad: torch.Tensor, layout) -> torch.Tensor:
    """The incoming gradient in the layout the backward was compiled for."""
    if layout == "contiguous":
        return grad if grad.is_contiguous() else grad.contiguous()
    if layout == "channels_last":
        return grad if grad.is_contiguous(memory_format=torch.channels_last) else \
            grad.contiguous(memory_format=torch.channels_last)
    if list(grad.stride()) == layout:
        return grad
    return torch.empty_strided(grad.shape, layout, dtype=grad.dtype, device=grad.device).copy_(grad)


def training_function(forward, backward, layout: TrainingLayout, autocast: bool) -> type[torch.autograd.Function]:
    """An autograd.Function running the compiled `forward` and `backward` (boxed calls: each takes
    its argument list and may clear it). Its first argument is a list it puts the outputs aliasing
    inputs in (TrainingGraph makes them again from the inputs); it returns the other outputs."""
    n_out, n_tensors = layout.num_outputs, layout.num_saved_tensors
    aliased = {a[0] for a in layout.aliases}
    returned = [i for i in range(n_out) if i not in aliased]
    position = {i: k for k, i in enumerate(returned)}
    differentiable = tuple(position[i] for i in layout.differentiable)
    tangents, donated, unsafe_views = tuple(layout.tangents), tuple(layout.donated), tuple(layout.unsafe_views)
    not_differentiable = [position[i] for i in returned if i not in set(layout.differentiable)]

    def run(call, args):
        if autocast:  # the casts autocast made are in the graphs: their ATen calls must not be cast again
            with torch._C._DisableAutocast():
                return call(args)
        return call(args)

    class TrainingFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, aliases, *args):
            outs = run(forward, list(args))
            del args
            saved = outs[n_out:n_out + n_tensors]
            # A saved view would keep its base's autograd history; its data is all the backward reads.
            ctx.save_for_backward(*(t.detach() if t._is_view() else t for t in saved))
            ctx.sizes = tuple(outs[n_out + n_tensors:])
            results = list(outs[:n_out])
            for i in unsafe_views:  # a view of the graph's own intermediate: autograd is to see a fresh tensor
                results[i] = torch.ops.aten._unsafe_view(results[i], results[i].shape)
            aliases.extend(results[a[0]] for a in layout.aliases)
            results = tuple(results[i] for i in returned)
            ctx.mark_non_differentiable(*(results[k] for k in not_differentiable))
            ctx._materialize_non_diff_grads = False
            return results

        @staticmethod
        def backward(ctx, *grads):
            if layout.deterministic is False and torch.are_deterministic_algorithms_enabled():
                raise RuntimeError("smelt: this compiled backward is being run with torch.use_deterministic_algorithms(True), "
                                   "but its forward was compiled while deterministic algorithms were off")
            args = [*ctx.sizes, *ctx.saved_tensors, *(_coerced(grads[k], t) for k, t in zip(differentiable, tangents))]
            del grads
            if torch._C._autograd._get_current_graph_task_keep_graph():
                # The graph is kept (retain_graph, create_graph): a later backward reads these again.
                for i in donated:
                    args[i] = separate_copy(args[i])
            ctx.maybe_clear_saved_tensors()  # the backward frees each saved tensor after its last read
            if torch.is_grad_enabled():  # create_graph=True: first-order gradients only, as AOTAutograd gives
                needs_anchor = not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
                return (None, *_FirstOrderOnly.apply(lambda args: run(backward, args),
                                                     torch.empty(0, requires_grad=True) if needs_anchor else None, *args))
            return (None, *run(backward, args))

    return TrainingFunction


class _FirstOrderOnly(torch.autograd.Function):
    """Gradients computed under create_graph=True: connected to what they were computed from (the
    incoming gradients, saved values; an anchor when nothing there needs grad), so a later backward
    through them is not silently a constant, and differentiating them raises."""

    @staticmethod
    def forward(ctx, compute, anchor, *args):
        return tuple(compute(list(args)))

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("smelt: torch.compile does not currently support double backward (a compiled graph's "
                           "backward differentiated again); run that part of the program without torch.compile")


class TrainingGraph:
    """Runs a cached training graph as AOTAutograd's runtime wrapper would: inputs held by the graph
    first, some inputs detached, the version counters of the inputs the graph writes moved on (a
    batch norm's running statistics; before the call, so that what the graph saves is not taken for
    changed since), the autograd.Function applied with grad mode on, then the outputs aliasing an
    input made again from it (a view of the input in autograd's eyes, as in eager)."""

    def __init__(self, function: type[torch.autograd.Function], layout: TrainingLayout, bumped=(), held=()):
        self.function = function
        self.detach = tuple(layout.detach)
        self.bumped = tuple(bumped)
        self.held = list(held)
        self.num_outputs = layout.num_outputs
        self.aliases = {a[0]: tuple(a[1:]) for a in layout.aliases}

    def __call__(self, *args):
        inputs = self.held + list(args)
        args = list(inputs)
        for i in self.detach:
            args[i] = args[i].detach()
        if self.bumped:
            torch.autograd.graph.increment_version(tuple(args[i] for i in self.bumped))
        aliases: list = []
        with torch.enable_grad():
            returned = iter(self.function.apply(aliases, *args))
        if not self.aliases:
            return list(returned)
        made = iter(aliases)
        return [_alias_of(inputs, next(made), *self.aliases[i]) if i in self.aliases else next(returned)
                for i in range(self.num_outputs)]


def _alias_of(inputs: list, made: torch.Tensor, base: int, is_input: bool, requires_grad: bool) -> torch.Tensor:
    """The output the graph made as a view of input `base` (or as that input), made again from it."""
    if is_input:
        return inputs[base]
    source = inputs[base]
    out = source.as_strided(made.size(), made.stride(), made.storage_offset())
    if source.requires_grad and not requires_grad:
        out = out.detach()
    elif requires_grad and not source.requires_grad:
        out.requires_grad_(True)
    return out
