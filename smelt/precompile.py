"""What torch's precompile keeps of a graph smelt compiled: `torch.compile(fn, fullgraph=True,
backend="smelt").aot_compile((args, kwargs))`, then `save_compiled_function(path)` and, in another
process, `torch.compiler.load_compiled_function(file)`.

torch saves Dynamo's guards and bytecode itself and asks the backend for its compiled function as
bytes (torch._dynamo.aot_compile_types.SerializableCallable). smelt gives the Dynamo graph as
Dynamo handed it over (FX's GraphPickler, taken before smelt's own rewrites of the graph), its
inputs' sizes, strides and dtypes, the grad mode and the settings of the compile; loading
compiles that graph again. Where smelt's graph cache holds it (the same machine, or a copied
SMELT_CACHE_DIR) that is a warm lookup, and the load skips Dynamo's trace, which a warm torch.compile
start cannot (MobileNetV3 on the CPU, `benchmarks/probes/warm_start_parts.py`: 0.26-0.30 s against
Dynamo's own 0.98-1.06). Elsewhere it is a cold compile, as correct. Not yet: symbolic sizes, inputs
sharing memory, an autocast entered outside the compiled function (each refused with the reason).

torch marks a precompile by `torch._functorch.config.force_autograd_cache` while the backend runs
(its eager backend reads the same flag); only then does smelt wrap what it returns.
"""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable

import torch

try:
    from torch._dynamo.aot_compile_types import SerializableCallable
except ImportError:  # a torch without precompile
    SerializableCallable = None

# What torch's precompile turns on in AOTAutograd around the backend for Inductor: caching of
# Inductor's output, which smelt's is not. Its lowering of a training graph's backward with the
# forward stays on, so that the save compiles (and the graph cache keeps) both, and the load as well.
_INDUCTOR_CACHE_SETTINGS = ("strict_autograd_cache", "bypass_autograd_cache_key", "bundled_autograd_cache",
                            "force_autograd_cache")


# Settings of the machine, not of the program: the load takes its own process's.
_MACHINE_SETTINGS = ("cache_dir", "debug_dir", "progress", "compile_workers")

# How a loaded graph is compiled: smelt.backend's compile_dynamo_graph, set when that module is
# imported (an unpickle importing this module imports the smelt package, and so the backend, first).
compile_graph: Callable | None = None


def aot_autograd_settings():
    """AOTAutograd's settings for smelt's compile of a graph, at the save and at the load."""
    known = torch._functorch.config.get_config_copy()
    settings = {k: False for k in _INDUCTOR_CACHE_SETTINGS if k in known}
    if "force_non_lazy_backward_lowering" in known:
        settings["force_non_lazy_backward_lowering"] = True
    return torch._functorch.config.patch(settings)


def available() -> bool:
    """Whether this torch has precompile (`torch.compile(...).aot_compile`: torch 2.13 has it, 2.11 not)."""
    return SerializableCallable is not None and hasattr(torch.compile(_identity, backend="eager"), "aot_compile")


def _identity(x):
    return x


def requested() -> bool:
    return SerializableCallable is not None and bool(getattr(torch._functorch.config, "force_autograd_cache", False))


_SYMBOLIC_SIZES = ("smelt: precompile (aot_compile) of a graph with symbolic sizes is not supported yet; "
                   "compile it with dynamic=False")


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """A graph input as the load must make it again: a tensor's metadata, or a plain value."""
    shape: tuple | None
    stride: tuple | None
    storage_offset: int
    dtype: torch.dtype | None
    device: str | None
    requires_grad: bool
    leaf: bool = True  # an input needing grad that is not a leaf is traced so (a training graph detaches leaves)
    value: Any = None

    @staticmethod
    def of(x) -> "InputSpec":
        if isinstance(x, torch.Tensor):
            sizes = (*x.shape, *x.stride(), x.storage_offset())
            if any(isinstance(s, torch.SymInt) for s in sizes):
                raise NotImplementedError(_SYMBOLIC_SIZES)
            return InputSpec(tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype, str(x.device),
                             x.requires_grad, x.is_leaf)
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise NotImplementedError(_SYMBOLIC_SIZES)
        return InputSpec(None, None, 0, None, None, False, value=x)

    def make(self, fake_mode):
        if self.shape is None:
            return self.value
        with fake_mode:
            t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
            if self.storage_offset:
                t = t.as_strided(self.shape, self.stride, self.storage_offset)
            if self.requires_grad:
                t.requires_grad_(True)
                if not self.leaf:
                    with torch.enable_grad():
                        t = t.clone()  # the same strides: Dynamo's inputs are dense
        return t


def _kept_metadata(key: str) -> bool:
    # Fake values hold their mode (not picklable) and the module stacks hold classes: the load
    # propagates fake values again (_propagate_example_values), which smelt's rewrites read.
    return key not in ("example_value", "val", "source_fn_stack", "nn_module_stack", "fwd_source_fn_stack")


def _propagate_example_values(gm: torch.fx.GraphModule, inputs, fake_mode) -> None:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm, fake_mode).propagate_dont_convert_inputs(*inputs)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]


def saved_graph(gm: torch.fx.GraphModule, example_inputs, settings: dict) -> bytes:
    """The Dynamo graph as smelt got it, before any rewrite, as the bytes a load compiles again."""
    from torch.fx._graph_pickler import GraphPickler, Options
    if torch._C._is_any_autocast_enabled():
        raise NotImplementedError(
            "smelt: precompile (aot_compile) under an autocast entered outside the compiled function is not "
            "supported yet; enter the autocast inside it")
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if len({x.untyped_storage()._cdata for x in tensors}) < len(tensors):
        raise NotImplementedError(
            "smelt: precompile (aot_compile) of a graph whose inputs share memory is not supported yet")
    try:
        graph = GraphPickler.dumps(gm, Options(ops_filter=None, node_metadata_key_filter=_kept_metadata))
    except Exception as e:  # an op or attribute FX's pickler cannot write
        raise NotImplementedError(f"smelt: precompile (aot_compile) cannot save this Dynamo graph: "
                                  f"{type(e).__name__}: {e}") from e
    return pickle.dumps({
        "graph": graph,
        "inputs": [InputSpec.of(x) for x in example_inputs],
        "settings": {k: v for k, v in settings.items() if k not in _MACHINE_SETTINGS},
        "grad": torch.is_grad_enabled(),  # AOTAutograd traces an inference graph or a training pair by it
    })


if SerializableCallable is not None:
    class PrecompiledGraph(SerializableCallable):
        """A smelt-compiled Dynamo graph that torch's precompile can save and load."""

        def __init__(self, compiled: Callable, saved: bytes):
            self.compiled = compiled
            self.saved = saved

        def __call__(self, *args, **kwargs):
            return self.compiled(*args, **kwargs)

        @classmethod
        def serialize_compile_artifacts(cls, fn: "PrecompiledGraph") -> bytes:
            return fn.saved

        @classmethod
        def deserialize_compile_artifacts(cls, data: bytes) -> "PrecompiledGraph":
            from torch._subclasses import FakeTensorMode
            from torch.fx._graph_pickler import GraphPickler
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            state = pickle.loads(data)
            fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
            gm = GraphPickler.loads(state["graph"], fake_mode)
            gm.recompile()
            # Its placeholders lost their Dynamo sources in the pickle; AOTAutograd asks for them on a
            # graph marked as Dynamo's, and takes one without the mark as it is.
            gm.meta.pop("dynamo_compile_id", None)
            inputs = [spec.make(fake_mode) for spec in state["inputs"]]
            with aot_autograd_settings(), torch.set_grad_enabled(state["grad"]), \
                    torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
                # The graph's values only where it compiles (0.44 -> 0.26-0.30 s for MobileNetV3's warm load).
                compiled = compile_graph(gm, inputs, state["settings"],
                                         on_miss=lambda: _propagate_example_values(gm, inputs, fake_mode))
            return cls(compiled, data)
