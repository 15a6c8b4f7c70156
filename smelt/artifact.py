"""What code generation leaves for one graph, and what the runtime reads of it: the wrapper source,
each kernel's source and launch settings, and the few Python objects the wrapper refers to by name.

It sits below both codegen and the runtime (neither imports the other for it), and a graph whose
`objects` are empty can be written to disk as JSON and rebuilt in another process. Besides the
records, the launch-side facts both sides must agree on: how a tiled kernel's programs lie on the
grid, and the layout of a row split's sync buffer.
"""
from __future__ import annotations

import base64
import dataclasses
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

# Programs along launch-grid axes 1 and 2 number at most this many (a CUDA limit).
GRID_AXIS_LIMIT = 65535
# A row split's sync buffer (codegen/triton/row_split.py) starts with a ticket counter and a
# finished counter; one arrival counter per (row group, barrier) follows.
SYNC_HEADER = 2


@dataclasses.dataclass(frozen=True)
class TileBlocks:
    xblock: int
    rblock: int
    num_warps: int
    grid_axes: tuple[str, str]  # which of x / r the program ids along launch axes 0 and 1 walk
    fold_axis1: bool  # axis 1 may need more than GRID_AXIS_LIMIT programs: it continues on axis 2


def grid_for(count0: int, count1: int) -> tuple[int, int, int]:
    """The launch grid for program counts along the two tile axes; see TileBlocks.fold_axis1."""
    return count0, min(count1, GRID_AXIS_LIMIT), -(-count1 // GRID_AXIS_LIMIT)


@dataclasses.dataclass
class BlockConfig:
    XBLOCK: int
    RBLOCK: int | None
    num_warps: int
    persistent: bool
    row_split: int = 1  # programs sharing one row (see codegen/triton/row_split.py)
    tiles: TileBlocks | None = None  # set for a tiled pointwise kernel


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    name: str
    source: str
    origins: tuple[str, ...]  # the ATen ops fused into it, for error messages
    config: BlockConfig | None  # None for a Halide kernel: its schedule is in its source
    candidates: tuple[BlockConfig, ...]  # more than one: timed on the first launch (autotuning)
    workspace: tuple[int, int, int] | None  # row split: (programs per row, barriers, partial slots)
    xnumel_arg: int  # position of xnumel among the launch arguments
    interpret: bool  # a CPU kernel, run by the Triton interpreter
    ticket: bool = False  # its last program runs a finisher (codegen/triton/finisher.py)
    backend: str = "triton"  # the name of the backend that printed it (codegen/backends.py)
    # A combo kernel (codegen/triton/combo.py): its members' sizes, its members' kinds, pointers
    # per kind, XBLOCK per kind, written pointers per kind, host scalars after the buffers.
    combo: tuple | None = None
    # With SMELT_CHECK_CUDA_COMPILE, an interpreted kernel's CUDA form, compiled at launch for sm_90.
    cuda_twin: CudaTwin | None = None
    # What its launch arguments will be, described as runtime/cuda_binary.describe does, where
    # codegen knows every size (None: it does not): the GPU binary is compiled ahead of the first
    # call (runtime/triton_loading.build_ahead). A wrong guess only costs a compile at launch.
    launch_guess: tuple | None = None
    # A kernel that is a Python object rather than source (codegen/reference/): it is what the
    # backend's runtime loads, held in memory only, so a graph with one is never written to disk.
    program: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "origins": list(self.origins),
                "config": dataclasses.asdict(self.config) if self.config is not None else None,
                "candidates": [dataclasses.asdict(c) for c in self.candidates],
                "workspace": list(self.workspace) if self.workspace is not None else None,
                "xnumel_arg": self.xnumel_arg, "interpret": self.interpret, "ticket": self.ticket,
                "backend": self.backend,
                "combo": [list(part) if isinstance(part, tuple) else part for part in self.combo]
                if self.combo is not None else None,
                "cuda_twin": self.cuda_twin.to_json() if self.cuda_twin is not None else None,
                "launch_guess": [list(a) for a in self.launch_guess] if self.launch_guess is not None else None}

    @classmethod
    def from_json(cls, data: dict) -> GeneratedKernel:
        workspace = data["workspace"]
        return cls(name=data["name"], source=data["source"], origins=tuple(data["origins"]),
                   config=_block_config(data["config"]) if data["config"] is not None else None,
                   candidates=tuple(_block_config(c) for c in data["candidates"]),
                   workspace=tuple(workspace) if workspace is not None else None,
                   xnumel_arg=data["xnumel_arg"], interpret=data["interpret"], ticket=data.get("ticket", False),
                   backend=data.get("backend", "triton"),
                   combo=_combo(data["combo"]) if data.get("combo") else None,
                   cuda_twin=CudaTwin.from_json(data["cuda_twin"]) if data.get("cuda_twin") else None,
                   launch_guess=tuple(tuple(a) for a in data["launch_guess"]) if data.get("launch_guess") else None)


@dataclasses.dataclass(frozen=True)
class CudaTwin:
    """An interpreted kernel as it would be generated for CUDA (SMELT_CHECK_CUDA_COMPILE): its own
    source and blocks, launched with the interpreted kernel's arguments and, as on the GPU, the
    buffers its launcher appends (a row split's workspace, a finisher's ticket)."""

    name: str
    source: str
    config: BlockConfig
    workspace: tuple[int, int, int] | None  # row split: (programs per row, barriers, partial slots)
    ticket: bool
    combo: bool  # a combo kernel: (work table, pointer table, XBLOCK)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "config": dataclasses.asdict(self.config),
                "workspace": list(self.workspace) if self.workspace is not None else None,
                "ticket": self.ticket, "combo": self.combo}

    @classmethod
    def from_json(cls, data: dict) -> CudaTwin:
        workspace = data["workspace"]
        return cls(name=data["name"], source=data["source"], config=_block_config(data["config"]),
                   workspace=tuple(workspace) if workspace is not None else None, ticket=data["ticket"],
                   combo=data["combo"])


def _combo(parts: list) -> tuple:
    sizes, kinds, pointers, xblocks, written, scalars = parts
    return (tuple(tuple(s) for s in sizes), tuple(kinds), tuple(pointers), tuple(xblocks),
            tuple(tuple(w) for w in written), scalars)


def _block_config(data: dict) -> BlockConfig:
    """A BlockConfig from its asdict() form, tiles (a nested dataclass, tuples as lists) included."""
    tiles = data.get("tiles")
    if tiles is not None:
        tiles = TileBlocks(**{**tiles, "grid_axes": tuple(tiles["grid_axes"])})
    return BlockConfig(**{**data, "tiles": tiles})


@dataclasses.dataclass
class GeneratedGraph:
    kind: str  # "inference" | "forward" | "backward"
    title: str
    wrapper_source: str
    kernels: list[GeneratedKernel]
    fallback_ops: list[str]
    # Names the wrapper reads that are not source: constant tensors and compiled subgraphs.
    objects: dict[str, object] = dataclasses.field(default_factory=dict)
    cache_key: str | None = None  # the graph cache's key for it, once written to or read from the cache
    # A forward's output strides where its layouts were planned (lowering/layout_plan.py), told to
    # AOTAutograd on every compile, the cached ones included; None where nothing was planned.
    output_strides: list | None = None
    # A forward's saved values returned as their padded rows: {position among the saved values:
    # (columns, row length)}, for its backward (layout_plan.read_padded_saved_rows).
    padded_saved: dict = dataclasses.field(default_factory=dict)
    # Compiled subgraphs among `objects` (torch.cond's branches): {name: the ATen graph's attribute
    # holding the branch, the nodes whose example values it was compiled for}. Written out as this;
    # a graph read back compiles them again (from the cache) before it runs.
    subgraph_sources: dict[str, dict] = dataclasses.field(default_factory=dict)

    @property
    def serializable(self) -> bool:
        """Whether it can be written out: its objects are plain tensors (constants), its kernels source."""
        return (all(type(v) is torch.Tensor for k, v in self.objects.items() if k not in self.subgraph_sources)
                and all(k.program is None for k in self.kernels))

    def to_json(self) -> dict:
        assert self.serializable, "a graph that refers to Python objects cannot be written out"
        return {"kind": self.kind, "title": self.title, "wrapper_source": self.wrapper_source,
                "kernels": [k.to_json() for k in self.kernels], "fallback_ops": list(self.fallback_ops),
                "constants": {name: _tensor_to_json(t) for name, t in self.objects.items()
                              if name not in self.subgraph_sources},
                "subgraphs": self.subgraph_sources,
                "output_strides": self.output_strides,
                "padded_saved": [[j, *shape] for j, shape in sorted(self.padded_saved.items())]}

    @classmethod
    def from_json(cls, data: dict) -> GeneratedGraph:
        return cls(kind=data["kind"], title=data["title"], wrapper_source=data["wrapper_source"],
                   kernels=[GeneratedKernel.from_json(k) for k in data["kernels"]],
                   fallback_ops=list(data["fallback_ops"]),
                   objects={name: _tensor_from_json(t) for name, t in data.get("constants", {}).items()},
                   output_strides=_strides_from_json(data.get("output_strides")),
                   padded_saved={j: (columns, width) for j, columns, width in data.get("padded_saved", [])},
                   subgraph_sources=dict(data.get("subgraphs", {})))


def _strides_from_json(strides: list | None) -> list | None:
    return None if strides is None else [None if s is None else tuple(s) for s in strides]


def _tensor_to_json(t: torch.Tensor) -> dict:
    """A constant as its storage's bytes and its view of them (torch.save's loader would give meta
    tensors back inside a compile: it follows the tracing context's fake mode)."""
    with unset_fake_temporarily():  # written while AOTAutograd's fake mode is active
        storage = t.detach().untyped_storage().cpu()
        data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()
    return {"device": str(t.device), "dtype": str(t.dtype).removeprefix("torch."), "size": list(t.shape),
            "stride": list(t.stride()), "offset": t.storage_offset(), "data": base64.b64encode(data).decode()}


def _tensor_from_json(data: dict) -> torch.Tensor:
    dtype = getattr(torch, data["dtype"])
    with unset_fake_temporarily():
        raw = bytearray(base64.b64decode(data["data"]))
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        flat = flat.view(dtype).to(data["device"])
        return flat.as_strided(data["size"], data["stride"], data["offset"])
