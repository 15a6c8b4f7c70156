"""The torch.compile entry: Dynamo hands us an FX graph; AOTAutograd splits it into forward and
backward ATen graphs (min-cut partitioned) and each goes through smelt's pipeline.

AOTAutograd is called directly rather than through torch._dynamo's `aot_autograd` helper, which
imports a large part of Inductor on its first use only to set up logging.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import sys

import torch
import torch._functorch.config as functorch_config
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from . import config as config_module
from . import graph_cache, observe, precompile
from .decompositions import decomposition_table
from .graph_cache.dynamo_level import DynamoCacheSlot
from .lowering.attention_masks import dense_attention_masks
from .lowering.eager_refusals import refuse_numbers_as_eager
from .lowering.handwritten_attention import handwritten_attention_to_sdpa
from .lowering.frozen_weights import weight_indices
from .lowering.fx_clones import drop_copies_before_layout_free_readers, drop_redundant_clones
from .lowering.fx_cse import merge_common_subexpressions
from .lowering.layout_plan import read_padded_saved_rows, restride_placeholders
from .pipeline import compile_graph, targets_for
from .saved_inputs import copy_mutated_inputs_saved_for_backward, donated_saved_inputs
from .runtime import compile_pool
from .runtime.kernel_binaries import prepare_compiler
from .target import switched_on

log = logging.getLogger("smelt")

# Checks that return nothing: older torch (2.11) does not thread them through effect tokens, so
# without this mark FX dead-code elimination drops them and a singular matrix passes silently.
for _check in (torch.ops.aten._linalg_check_errors.default,):
    torch.fx.node.has_side_effect(_check)


# torch.compile's `mode`, as settings of the compile (Inductor's modes, by what they ask for).
MODES = {
    "default": {},
    "reduce-overhead": {"cuda_graphs": True},
    "max-autotune": {"autotune": True, "cuda_graphs": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}


def compile_settings(mode=None, options=None) -> dict:
    """The settings torch.compile(..., mode=, options=) asks for: `options` names Config fields
    (smelt/config.py), e.g. {"cuda_graphs": True}; config.override checks each name and value."""
    if mode is not None and mode not in MODES:
        raise config_module.SettingError(f"smelt: torch.compile mode {mode!r} is not accepted; accepted: "
                                         f"{', '.join(MODES)}")
    if options is not None and not isinstance(options, dict):
        raise config_module.SettingError(f"smelt: torch.compile options must be a dict of smelt settings, "
                                         f"not {type(options).__name__}")
    known = {f.name for f in dataclasses.fields(config_module.Config)}
    unknown = sorted(set(options or {}) - known)
    if unknown:
        raise config_module.SettingError(f"smelt: torch.compile option(s) {', '.join(map(repr, unknown))} not "
                                         f"accepted; accepted: {', '.join(sorted(known))}")
    return {**MODES[mode or "default"], **(options or {})}


class _Compiler:
    """What AOTAutograd calls for each ATen graph of one Dynamo graph."""

    def __init__(self, kind: str, slot: DynamoCacheSlot, settings: dict, pair: dict):
        self.kind = kind
        self.slot = slot
        self.settings = settings  # torch.compile's mode and options: a backward compiled later keeps them
        self.pair = pair  # what the forward tells its backward (the same dict in both compilers)

    def __call__(self, gm, example_inputs):
        if self.kind == "forward":
            copy_mutated_inputs_saved_for_backward(gm)
        if self.kind == "inference" and self.pair.get("weights"):
            if len(gm.graph.find_nodes(op="placeholder")) == self.slot.num_inputs:
                gm.meta["smelt_frozen_weights"] = self.pair["weights"]
            else:  # AOTAutograd merged or split inputs: positions no longer name the weights
                log.debug("smelt: weights not frozen: the inference graph's inputs are not Dynamo's")
        if self.kind == "backward":
            padded = self.pair.get("padded_saved")
            if padded:  # saved values the forward returns as their padded rows
                example_inputs = read_padded_saved_rows(gm, example_inputs, padded)
                gm.meta["smelt_padded_saved"] = padded
            restride_placeholders(gm, example_inputs)  # saved activations in the forward's chosen layouts
            gm.meta["smelt_donated_inputs"] = donated_saved_inputs(gm)
        with config_module.override(**self.settings):
            compiled = compile_graph(gm, example_inputs, self.kind)
        if self.kind == "forward":
            self.pair["padded_saved"] = compiled.padded_saved
        self.slot.observe_compile(self.kind, gm, compiled)
        if self.kind == "backward" and self.pair.get("lowered_with_forward"):
            _take_over_donation(compiled)
        return compiled


def lowers_backward_with_forward(cfg, cuda: bool) -> bool:
    """Whether a training graph's backward is lowered right after its forward, while the workers
    build the forward's GPU kernels (pipeline.py), rather than at the first backward after waiting
    for them: ResNet-50's cold AMP training first call 45.8 -> 33.2 s on the H200. A forward whose
    backward never runs pays for the backward's compile."""
    builds_deferred = graph_cache.enabled(cfg) and cfg.compile_workers > 1 and (
        cuda or (cfg.check_cuda_compile and cfg.backend_for("cpu") == "triton"))  # the CPU's stand-in for tests
    return builds_deferred and hasattr(functorch_config, "force_non_lazy_backward_lowering")


def _take_over_donation(compiled) -> None:
    """A backward lowered with its forward is compiled before its first backward says whether the
    graph is kept (retain_graph, create_graph). AOTAutograd's lazy compile would then leave out its
    donated buffers; its runtime refuses a kept graph on a backward compiled with them. smelt keeps
    them and takes the check over: under a kept graph the backward gets copies of the ones whose memory
    it hands to other buffers (CompiledGraph.copied_when_kept; about what a backward compiled without
    donation would allocate), and AOTAutograd's list, which its check reads at each backward, is
    emptied in place (the forward's metadata and the runtime's share the list)."""
    compiled.copied_when_kept = tuple(compiled.namespace.get("WRITTEN_DONATED_INPUTS", ()))
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    listed = getattr(meta, "bw_donated_idxs", None)
    if listed:
        del listed[:]


class _BackwardCompiler(_Compiler):
    # Dynamo must neither trace the compiler nor the backward graph it returns: AOTAutograd may
    # compile the backward lazily, from inside a compiled region.
    def __call__(self, gm, example_inputs):
        compile_backward = torch._dynamo.disable(super().__call__)
        try:
            return torch._dynamo.disable(compile_backward(gm, example_inputs))
        except Exception as e:
            if not self.pair.get("lowered_with_forward"):
                raise
            # Lowered with its forward, the backward's failure would fail the forward's compile:
            # it is raised where a lazily compiled backward's is, at the first backward.
            log.debug("smelt: the backward did not compile; raised at the first backward: %s", e)
            return _raises_when_called(e)


def _raises_when_called(error: Exception):
    def backward(args):
        raise error
    backward._boxed_call = True
    return backward


def _partition_joint_graph(joint_module, joint_inputs, **kwargs):
    """The min-cut partition of a training graph, its repeated calls merged first by smelt's pass:
    AOTAutograd's own merging pass imports most of Inductor on its first use (0.9 s of every
    process's first training compile, warm or cold). Clones that copy nothing go first too:
    training's dropout of probability 0 is a clone, and the partitioner, which would recompute
    through it, then saved a layer norm's float32 result where it saves its bfloat16 input without
    (Phi's AMP training peak). So do copies that fused attention's forward and backward read as
    views anyway: the partitioner then saves the projections' rows, and the gradients come out in
    their layout."""
    drop_redundant_clones(joint_module)
    drop_copies_before_layout_free_readers(joint_module)
    merge_common_subexpressions(joint_module)
    with functorch_config.patch(cse=False):
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)


def smelt_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        from torch._dynamo.utils import flatten_graph_inputs  # compiled autograd's boxed inputs
        return flatten_graph_inputs(gm, example_inputs, functools.partial(smelt_backend, mode=mode, options=options))
    # An override around the call that compiles holds for its backward too, which AOTAutograd
    # compiles at the first backward: on CUDA, on autograd's device thread, outside the block.
    settings = {**config_module.overridden(), **compile_settings(mode, options)}
    if precompile.requested():  # torch's aot_compile: what it returns must save and load
        saved = precompile.saved_graph(gm, example_inputs, settings)  # before the rewrites below
        with precompile.aot_autograd_settings():
            return precompile.PrecompiledGraph(compile_dynamo_graph(gm, example_inputs, settings), saved)
    return compile_dynamo_graph(gm, example_inputs, settings)


def compile_dynamo_graph(gm: torch.fx.GraphModule, example_inputs, settings: dict, on_miss=None):
    """A Dynamo graph compiled under `settings` (smelt.config.override's fields). `on_miss()` runs
    where the graph cache does not serve it, before anything reads the graph's values (a precompiled
    graph's load propagates them there, not on a hit)."""
    with config_module.override(**settings):
        cfg = config_module.current()
    slot = DynamoCacheSlot(gm, example_inputs, cfg)
    pair: dict = {}
    if cfg.freeze_weights and not torch.is_grad_enabled():
        # AOTAutograd's inputs: the tensors the graph holds, then Dynamo's (DynamoCacheSlot.held).
        pair["weights"] = [len(slot.held) + i for i in weight_indices(example_inputs)]
        if pair["weights"]:
            slot.key = None  # a cached entry would come back without its prologue
    with config_module.override(**settings):
        cached = slot.lookup()
    if cached is not None:
        return cached
    if on_miss is not None:
        on_miss()
    refuse_numbers_as_eager(gm)
    cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
    if cuda:
        prepare_compiler()
        if graph_cache.enabled(cfg):  # where binaries are kept, workers compile them (triton_loading.build_ahead):
            compile_pool.start(cfg.compile_workers, "triton")  # they import Triton's compiler while AOTAutograd traces
    pair["lowered_with_forward"] = lowers_backward_with_forward(cfg, cuda)
    if cfg.attention_rewrite:
        target_for = targets_for(cfg)
        handwritten_attention_to_sdpa(gm, lambda device_type, training: switched_on(
            cfg.short_attention, target_for(device_type), "short_attention_training" if training else "short_attention_kernel"))
    dense_attention_masks(gm)
    lowering = functorch_config.patch(force_non_lazy_backward_lowering=True) if pair["lowered_with_forward"] \
        else contextlib.nullcontext()
    with lowering:
        compiled = aot_module_simplified(
            gm, example_inputs,
            fw_compiler=_Compiler("forward", slot, settings, pair),
            bw_compiler=_BackwardCompiler("backward", slot, settings, pair),
            inference_compiler=_Compiler("inference", slot, settings, pair),
            decompositions=decomposition_table(),
            partition_fn=_partition_joint_graph,
            keep_inference_input_mutations=True,
        )
    slot.commit()
    return compiled  # Dynamo runs what a backend returns with itself disabled


precompile.compile_graph = compile_dynamo_graph


def _reset() -> None:
    """Dynamo calls a backend's reset() in torch._dynamo.reset(): smelt's record lets its latest graphs
    go, CUDA-graphed calls forget their recordings, and their pools close (their memory is the
    device's again at the next torch.cuda.empty_cache(), as Inductor's recordings' is)."""
    observe.forget_latest()
    cuda_graphs = sys.modules.get("smelt.runtime.cuda_graphs")
    if cuda_graphs is not None and cuda_graphs._live:
        gc.collect()  # outputs in reference cycles: no longer held
        cuda_graphs.reset()


smelt_backend.reset = _reset
