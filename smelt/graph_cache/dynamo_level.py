"""The cache one level up: a Dynamo graph whose AOTAutograd result is a plain inference graph (this
module) or a plain forward and backward pair (training_graph.py).

For such a graph AOTAutograd's runtime wrapper only turns grad mode off around the compiled ATen
graph, whose inputs are Dynamo's inputs in the same order and whose outputs are Dynamo's outputs.
When a later process meets the same Dynamo graph with the same inputs, it can run the cached ATen
graph directly and skip AOTAutograd's tracing. A graph qualifies only when that is provably so,
checked on AOTAutograd's own metadata while the first process compiles it: no input mutations
other than data written inside the graph (an optimizer's in-place updates; the wrapper then only
bumps those inputs' version counters, as AOTAutograd's does), outputs aliasing an input made again
from it after the call (as the wrapper makes them) and none aliasing each other or an intermediate,
no effect tokens, no tensor subclasses, no grad-mode change inside, a single inference graph.
Anything else compiles as usual. A graph compiled under autocast (whose state is in the key) runs with autocast off, as AOTAutograd's wrapper runs it: the casts
autocast made are in the ATen graph, and its ATen calls must not be cast again.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from .. import observe
from ..config import note_interpreted_cpu_kernels
from ..runtime.assemble import assemble
from ..runtime.launcher import items_getter
from . import enabled, load_generated, stats
from .fingerprint import Uncacheable, digest, dynamo_graph_text, environment_text
from .store import read_entry, write_entry
from .training_graph import (TrainingGraph, TrainingLayout, check_forward, describe, input_aliases, made_again,
                             saved_kinds, training_function)

log = logging.getLogger("smelt.graph_cache")


class DynamoCacheSlot:
    """The cache entry for one Dynamo graph: read before AOTAutograd runs, written after it, when
    the graph qualifies."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, cfg):
        self.cfg = cfg
        # The tensors the graph holds (an optimizer's parameters and state): AOTAutograd passes
        # them first, in this order, then the graph's inputs.
        held = {**dict(gm.named_parameters(remove_duplicate=False)), **dict(gm.named_buffers(remove_duplicate=False))}
        self.held = list(held.values())
        self.num_inputs = len(self.held) + len(example_inputs)
        self.num_outputs = _count_outputs(gm)
        self.key = None
        self.compiled_kinds: list[str] = []
        self.inference_key = None
        self.forward = None  # a training graph's (forward key, AOTAutograd's metadata, saved_kinds), once compiled
        self.bumped: list[int] = []  # inputs written in the graph whose version counters move
        self.aliases: list[list] = []  # an inference graph's outputs aliasing inputs (training_graph.input_aliases)
        self.reason = None  # why the graph does not qualify, once known
        self.autocast = torch._C._is_any_autocast_enabled()  # AOTAutograd's disable_amp
        if not enabled(cfg):
            return
        try:
            graph_text = dynamo_graph_text(gm, [*self.held, *example_inputs], frozenset(held))
            self.key = digest(f"{environment_text(cfg)}\n{graph_text}")
        except Uncacheable as e:
            stats["dynamo_uncacheable"] += 1
            log.debug("smelt: Dynamo graph not cached: %s", e)

    def lookup(self):
        """The compiled callable from the cache, or None."""
        if self.key is None:
            return None
        body = read_entry(self.cfg.cache_dir, "dynamo", self.key)
        if body is None:
            stats["dynamo_miss"] += 1
            return None
        bumped = body.get("bump_versions", [])
        training = body.get("kind") == "training"
        keys = [body.get("forward_key"), body.get("backward_key")] if training else [body.get("aten_key")]
        try:
            layout = TrainingLayout.from_json(body["layout"]) if training else None
        except (KeyError, TypeError):
            layout = None
        aliases = layout.aliases if layout is not None else body.get("aliases", [])
        inputs = range(self.num_inputs)
        if body.get("num_inputs") != self.num_inputs or not all(isinstance(k, str) for k in keys) \
                or not all(isinstance(i, int) and i in inputs for i in bumped) \
                or body.get("autocast", False) != self.autocast or (training and layout is None) \
                or (layout is not None and not all(i in inputs for i in layout.detach)) \
                or not all(isinstance(a, list) and len(a) == 4 and a[1] in inputs for a in aliases):
            log.warning("smelt: ignoring Dynamo graph cache entry %s with a wrong layout", self.key)
            return None
        graphs = []
        for key in keys:
            generated = load_generated(key, self.cfg)
            if generated is None:
                stats["dynamo_miss"] += 1
                return None
            generated.cache_key = key
            graphs.append(generated)
        compiled = []
        for generated, kind in zip(graphs, ["forward", "backward"] if training else ["inference"]):
            graph = assemble(generated, self.cfg.cache_dir, keep_kernels=True, cuda_graphs=self.cfg.cuda_graphs)
            note_interpreted_cpu_kernels(generated.kernels)
            graph.kind = kind
            observe.record(graph)
            compiled.append(graph)
        stats["dynamo_hit"] += 1
        log.debug("smelt: graph cache hit for a Dynamo graph (%s): AOTAutograd skipped", self.key[:16])
        if training:
            # Copied under a kept graph: the donated inputs the backward hands to other buffers.
            written = compiled[1].namespace.get("WRITTEN_DONATED_INPUTS", ())
            layout = dataclasses.replace(layout, donated=[i for i in layout.donated if i in written])
            function = training_function(compiled[0].call, compiled[1].call, layout, self.autocast)
            return TrainingGraph(function, layout, bumped, self.held)
        return InferenceGraph(compiled[0].call, bumped, self.held, self.autocast, aliases)

    def observe_compile(self, kind: str, aten_gm: torch.fx.GraphModule, compiled) -> None:
        """Called by smelt's AOTAutograd compilers for every ATen graph of this Dynamo graph; a
        training graph's entry is written when its backward has compiled (AOTAutograd compiles it at
        the first backward)."""
        self.compiled_kinds.append(kind)
        if self.key is None or self.reason is not None:
            return
        try:
            if compiled.cache_key is None:
                raise Uncacheable(f"its {kind} ATen graph is not cached")
            if kind == "inference":
                self.bumped, self.aliases = _check_plain_inference(aten_gm, self.num_inputs, self.num_outputs)
                self.inference_key = compiled.cache_key
            elif kind == "forward":
                meta = _fw_metadata()
                check_forward(meta, aten_gm, self.num_inputs, self.num_outputs)
                self.bumped = _bumped_versions(meta)
                self.forward = (compiled.cache_key, meta, saved_kinds(aten_gm, self.num_outputs))
            elif kind == "backward" and self.forward is not None:
                forward_key, meta, saved = self.forward
                layout = describe(meta, saved, aten_gm, self.num_outputs)
                write_entry(self.cfg.cache_dir, "dynamo", self.key,
                            {"kind": "training", "forward_key": forward_key, "backward_key": compiled.cache_key,
                             "layout": layout.to_json(), "num_inputs": self.num_inputs, "bump_versions": self.bumped,
                             "autocast": self.autocast})
                stats["dynamo_stored"] += 1
        except Uncacheable as e:
            self.reason = str(e)
            if kind != "inference":  # an inference graph's reason is logged by commit
                log.debug("smelt: Dynamo graph not cached: %s", e)

    def commit(self) -> None:
        """After AOTAutograd: write the entry of an inference graph that turned out to qualify."""
        if self.key is None or "forward" in self.compiled_kinds:  # a training graph's is written by its backward
            return
        if self.compiled_kinds != ["inference"] or self.inference_key is None:
            log.debug("smelt: Dynamo graph not cached: %s",
                      self.reason or f"AOTAutograd compiled {', '.join(self.compiled_kinds) or 'nothing'}")
            return
        write_entry(self.cfg.cache_dir, "dynamo", self.key,
                    {"aten_key": self.inference_key, "num_inputs": self.num_inputs, "bump_versions": self.bumped,
                     "autocast": self.autocast, "aliases": self.aliases})
        stats["dynamo_stored"] += 1


class InferenceGraph:
    """Runs a cached inference graph as AOTAutograd's runtime wrapper would: the version counters of
    the inputs it writes moved on (autograd's check for tensors changed in place after being saved
    relies on them), then the graph called with grad mode off (and autocast off, for a graph
    compiled under it)."""

    def __init__(self, call, bumped=(), held=(), autocast: bool = False, aliases=()):
        self.call = call
        self.aliases = list(aliases)
        self.bumped = tuple(bumped)
        self.held = list(held)
        self.autocast = autocast
        self._written = items_getter(self.bumped)  # no generator per call: an optimizer writes hundreds

    def __call__(self, *args):
        args = self.held + list(args)
        if self.bumped:  # before the call, as AOTAutograd's wrapper does
            torch.autograd.graph.increment_version(self._written(args))
        grad = torch.is_grad_enabled()
        if grad:
            torch._C._set_grad_enabled(False)
        try:
            if self.autocast:
                with torch._C._DisableAutocast():
                    result = self.call(list(args))
            else:
                result = self.call(list(args))
        finally:
            if grad:
                torch._C._set_grad_enabled(True)
        return made_again(result, args, self.aliases) if self.aliases else result


def _count_outputs(gm: torch.fx.GraphModule) -> int:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = output.args[0]
    return len(results) if isinstance(results, (list, tuple)) else -1


def _fw_metadata():
    return getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)


def _bumped_versions(meta) -> list[int]:
    """The inputs written inside the graph whose version counters AOTAutograd's wrapper moves on."""
    bumped = getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", None)
    if any(i.mutates_data for i in meta.input_info) and (bumped is None or meta.mutated_inp_runtime_indices):
        raise Uncacheable("it mutates an input outside the graph")
    return list(bumped or [])


def _check_plain_inference(aten_gm, num_inputs: int, num_outputs: int) -> tuple[list[int], list[list]]:
    """The inputs whose version counters AOTAutograd's wrapper moves, and the outputs it makes again
    from an input; raises Uncacheable unless that and turning grad mode off is all the wrapper
    does (see the module docstring)."""
    meta = _fw_metadata()
    if meta is None:
        raise Uncacheable("AOTAutograd's metadata is not available")
    if any(i.mutates_metadata or getattr(i, "mutates_storage_metadata", False) for i in meta.input_info):
        raise Uncacheable("it changes an input's shape or strides")
    bumped = _bumped_versions(meta)
    aliases = input_aliases(meta, aten_gm)
    if meta.num_intermediate_bases or getattr(meta, "tokens", None) or getattr(meta, "num_graphsafe_rng_states", 0):
        raise Uncacheable("AOTAutograd adds outputs, effect tokens or RNG state")
    if getattr(meta, "grad_enabled_mutation", None) is not None:
        raise Uncacheable("it changes grad mode")
    if any(type(m).__name__ == "SubclassCreationMeta"
           for m in [*getattr(meta, "subclass_inp_meta", []), *getattr(meta, "subclass_fw_graph_out_meta", [])]):
        raise Uncacheable("it involves tensor subclasses")
    placeholders = sum(1 for n in aten_gm.graph.nodes if n.op == "placeholder")
    if placeholders != num_inputs or len(meta.output_info) != num_outputs or _count_outputs(aten_gm) != num_outputs:
        raise Uncacheable("AOTAutograd changed the inputs or outputs")
    return bumped, aliases
