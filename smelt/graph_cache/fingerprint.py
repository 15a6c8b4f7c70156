"""Cache keys: a text that names everything a compiled graph depends on, or the reason there is none.

A key holds the graph's code, the metadata of every value in it (sizes, strides, storage offsets,
dtypes, devices), smelt's own source, the versions of torch, Triton, sympy and Python, smelt's
settings, and torch's global state that tracing reads (grad mode, default dtype, autocast,
deterministic algorithms, matmul and attention flags), and the bytes of small tensor constants.
Graphs with symbolic sizes, large constants, submodules or calls into code outside torch have no
key: they compile every time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
import sys

import sympy
import torch
import torch._functorch.config
from torch._subclasses.fake_tensor import unset_fake_temporarily
import triton

from ..source_digest import smelt_source_digest

FORMAT_VERSION = 1


class Uncacheable(Exception):
    """Raised while building a key; the message says why the graph is compiled afresh."""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def settings_text(cfg) -> str:
    # Where things are written, whether the cache is on, whether a bar shows the build and how many
    # processes build it do not change what is compiled. CUDA graphs do: a recorded graph takes no
    # donated input's memory (scheduler/reuse.py) and leaves depthwise convolutions to cuDNN.
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name not in ("cache_dir", "debug_dir", "graph_cache", "progress", "compile_workers")}
    return json.dumps(fields, sort_keys=True, default=str)


def torch_state_text() -> str:
    """torch's global state that changes what tracing produces or what the compiled code computes."""
    parts = {"default_dtype": str(torch.get_default_dtype()),
             "grad": torch.is_grad_enabled(),
             "deterministic": torch.are_deterministic_algorithms_enabled(),
             "matmul_precision": torch.get_float32_matmul_precision(),
             "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
             "cudnn": [torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32,
                       torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
             "sdp": [torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                     torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled()]}
    # Autocast changes the ATen graph AOTAutograd traces, and whether its wrapper turns autocast off
    # around the compiled call (graph_cache.dynamo_level).
    parts["autocast"] = {d: [torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))] for d in ("cpu", "cuda")}
    guard = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    if guard is not None and hasattr(guard.GlobalStateGuard, "__getstate__"):
        parts["dynamo_global_state"] = guard.GlobalStateGuard().__getstate__()
    return json.dumps(parts, sort_keys=True, default=str)


@functools.lru_cache(maxsize=None)
def _versions_text() -> str:
    return json.dumps({"format": FORMAT_VERSION, "smelt": smelt_source_digest(), "torch": torch.__version__,
                       "triton": triton.__version__, "sympy": sympy.__version__,
                       "python": list(sys.version_info[:2])})


def environment_text(cfg) -> str:
    return f"{_versions_text()}\n{settings_text(cfg)}\n{torch_state_text()}"


def value_text(value, shapes: "SymbolicFacts | None" = None) -> str:
    """Metadata of one value of a graph; raises Uncacheable for unknown values, and for symbolic
    ones unless `shapes` collects what they depend on."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise Uncacheable(f"a {value.layout} tensor")
        sizes = [_size_text(s, shapes) for s in (*value.shape, *value.stride(), value.storage_offset())]
        rank = value.dim()
        return (f"T({value.dtype},{value.device},({','.join(sizes[:rank])}),({','.join(sizes[rank:2 * rank])}),"
                f"{sizes[-1]},{int(value.requires_grad)})")
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(v, shapes) for v in value) + "]"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _size_text(value, shapes)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    raise Uncacheable(f"a value of type {type(value).__name__}")


class SymbolicFacts:
    """What a graph's symbolic sizes are keyed by beside their expressions: the value each had when
    traced (smelt judges some layouts at those values, as a compile in this process would), and what
    the shape environment knows of their symbols (ranges, guards), which index simplification relies on."""

    def __init__(self):
        self.shape_env = None
        self.symbols: set = set()

    def add(self, value) -> str:
        node = value.node
        self.shape_env = node.shape_env
        self.symbols |= node.expr.free_symbols
        hint = node.hint if node.has_hint() else None
        return f"{node.expr}@{hint}"

    def text(self) -> str:
        if self.shape_env is None:
            return ""
        env = self.shape_env
        ranges = {str(s): str(env.var_to_range.get(s)) for s in self.symbols}
        guards = sorted(str(g.expr) for g in env.guards)
        divisible = sorted(str(d) for d in getattr(env, "divisible", ()))
        return json.dumps({"ranges": ranges, "guards": guards, "divisible": divisible}, sort_keys=True)


def _size_text(size, shapes) -> str:
    if type(size) is int:
        return str(size)
    if shapes is None:
        raise Uncacheable("symbolic sizes")
    return shapes.add(size)


# Tensor constants of an ATen graph (a causal mask, a lifted scalar) are keyed by their bytes and
# kept in the entry; larger ones would make the cache a copy of the model's weights.
MAX_CONSTANT_BYTES = 1 << 20


def aten_graph_text(gm: torch.fx.GraphModule, kind: str) -> str:
    """The code of an ATen graph, the metadata of every node in it and its constants' contents."""
    lines = [kind, gm.code]
    shapes = SymbolicFacts()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(gm)
            if isinstance(value, torch.fx.GraphModule):  # a subgraph (torch.cond's branch): keyed by its own text
                lines.append(f"{node.name}: subgraph\n{aten_graph_text(value, 'subgraph')}")
            else:
                lines.append(f"{node.name}: {constant_text(value, node.target)}")
            continue
        if node.op == "call_module":
            raise Uncacheable(f"the graph holds {node.op} {node.target}")
        if node.op == "output":
            continue
        lines.append(f"{node.name}: {value_text(node.meta.get('val'), shapes)}")
    lines.append(shapes.text())
    return "\n".join(lines)


def constant_text(value, name: str) -> str:
    """A tensor constant's metadata and a digest of its bytes; Uncacheable for anything else."""
    if not isinstance(value, torch.Tensor) or type(value) is not torch.Tensor:
        raise Uncacheable(f"the graph holds get_attr {name} ({type(value).__name__})")
    if value.untyped_storage().nbytes() > MAX_CONSTANT_BYTES:
        raise Uncacheable(f"the graph holds a constant of {value.untyped_storage().nbytes()} bytes ({name})")
    with unset_fake_temporarily():  # keys are made while AOTAutograd's fake mode is active
        data = value.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
    return f"{value_text(value)} sha256={hashlib.sha256(data).hexdigest()}"


_TRUSTED_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_TRUSTED_OP_NAMESPACES = ("aten", "prims")


def _check_target(target) -> None:
    """A Dynamo graph is traced again by AOTAutograd: a call is safe to key by its printed name
    only when what it does is fixed by the torch version (not user code, not a custom op)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        if str(target).split(".")[0] not in _TRUSTED_OP_NAMESPACES:
            raise Uncacheable(f"it calls the custom op {target}")
        return
    if isinstance(target, torch._ops.HigherOrderOperator):
        if target.name() not in _KEYED_HIGHER_ORDER:
            raise Uncacheable(f"it calls {target.name()}")
        return
    if target in (operator.getitem,):
        return
    module = getattr(target, "__module__", None) or ""
    if module.split(".")[0] not in _TRUSTED_MODULES or module.startswith("torch._dynamo"):
        raise Uncacheable(f"it calls {getattr(target, '__qualname__', target)} from {module or 'unknown code'}")


# Higher-order ops keyed by their printed call and their subgraphs' code, when every other argument
# is a value or a literal (activation checkpointing without a user's context_fn).
_KEYED_HIGHER_ORDER = frozenset({"tag_activation_checkpoint"})


def _code_text(gm: torch.fx.GraphModule, attributes=frozenset()) -> list[str]:
    """A Dynamo graph's code and its subgraphs', raising Uncacheable for what the code does not say."""
    lines = [gm.code]
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target in attributes:
            continue
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.fx.GraphModule) \
                and all(isinstance(user.target, torch._ops.HigherOrderOperator) for user in node.users):
            subgraph = getattr(gm, node.target)
            if any(callable(v) for v in getattr(subgraph, "meta", {}).values()):
                raise Uncacheable(f"its subgraph {node.target} carries code of its own (a checkpoint's context_fn)")
            lines += [f"subgraph {node.target}:", *_code_text(subgraph)]
            continue
        if node.op in ("get_attr", "call_module"):
            raise Uncacheable(f"the graph holds {node.op} {node.target}")
        if node.op == "call_function":
            _check_target(node.target)
            if isinstance(node.target, torch._ops.HigherOrderOperator) and not all(
                    isinstance(v, (torch.fx.Node, bool, int, float, str, type(None)))
                    for v in (*node.args, *node.kwargs.values())):
                raise Uncacheable(f"{node.target.name()} takes an argument its printed call does not show")
    return lines


def dynamo_graph_text(gm: torch.fx.GraphModule, example_inputs, attributes=frozenset()) -> str:
    """The code of a Dynamo graph (and of its subgraphs) and the metadata of its inputs. `attributes`
    are the names of the tensors it holds (AOTAutograd's leading inputs), whose metadata
    `example_inputs` includes."""
    lines = _code_text(gm, attributes)
    shapes = SymbolicFacts()
    for x in example_inputs:
        if isinstance(x, torch.SymInt):  # a size Dynamo passes as an input of a graph of symbolic sizes
            lines.append(value_text(x, shapes))
            continue
        if not isinstance(x, torch.Tensor):
            raise Uncacheable(f"an input of type {type(x).__name__}")
        if type(x).__name__ not in ("FakeTensor", "Tensor", "Parameter"):
            raise Uncacheable(f"a {type(x).__name__} input")
        lines.append(value_text(x, shapes))
        if x.device.type == "cuda":
            lines.append(f"{torch.cuda.get_device_name(x.device)} {torch.cuda.get_device_capability(x.device)}")
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    # Whether an input needing grad is a leaf decides whether a training graph detaches it (training_graph.py).
    lines.append("leaves " + "".join(str(int(x.is_leaf)) for x in tensors))
    # Inputs sharing memory are traced as views of one base: for each, the first input of its storage.
    first_of: dict = {}
    lines.append("storages " + ",".join(str(first_of.setdefault(x.untyped_storage()._cdata, i))
                                        for i, x in enumerate(tensors)))
    lines.append(shapes.text())
    functorch_config = torch._functorch.config.get_config_copy()
    lines.append(json.dumps(functorch_config, sort_keys=True, default=repr))
    return "\n".join(lines)
