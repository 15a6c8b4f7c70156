"""What a model is to the suite, and the registry the zoo's families fill (zoo.py gathers them).

A ModelSpec builds the model with random weights (never downloading anything) and makes its
inputs, in one of two sizes: `tiny` (the CPU tests: as small as still runs every op the real model
runs) and `real` (a GPU run at the sizes people train). Families register themselves from
zoo_vision (timm), zoo_text (transformers) and zoo_torch (torch.nn).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config never reaches for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SIZES = ("tiny", "real")
FAMILIES = ("cnn", "vit", "encoder", "decoder", "seq2seq", "torch")


@dataclasses.dataclass
class Sample:
    """One batch: the model's keyword arguments and, for training, the targets of its loss."""
    kwargs: dict
    labels: torch.Tensor | None = None

    def to(self, device, float_dtype=None) -> "Sample":
        def move(t):
            if not isinstance(t, torch.Tensor):
                return t
            if float_dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=float_dtype)
            return t.to(device)
        return Sample({k: move(v) for k, v in self.kwargs.items()}, move(self.labels))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    build: Callable[[str], torch.nn.Module]  # size -> model, random weights, dropout 0
    sample: Callable[..., Sample]  # (size, seq_len=None, generator) -> Sample
    loss: Callable[[torch.nn.Module, Sample], torch.Tensor]  # a scalar to train on
    requires: str  # the library the model comes from: "timm", "transformers" or "torch"
    default_seq: dict = dataclasses.field(default_factory=dict)  # size -> sequence length (text models)

    @property
    def is_decoder(self) -> bool:
        return self.family == "decoder"


ZOO: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    assert spec.name not in ZOO, spec.name
    assert spec.family in FAMILIES, spec.family
    ZOO[spec.name] = spec
    return spec


def library_missing(spec: ModelSpec) -> str | None:
    """Why the spec's library cannot be used here, or None."""
    try:
        if spec.requires == "timm":
            from .torchvision_stub import install_if_missing
            install_if_missing()
            import timm  # noqa: F401
        elif spec.requires == "transformers":
            import transformers  # noqa: F401
    except ImportError as exc:
        return f"{spec.requires} is not installed ({exc})"
    return None


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def build_model(spec: ModelSpec, size: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return spec.build(size)


def autocast_for(device):
    """AMP bfloat16 on CUDA (the suite's training mode); nothing on the CPU."""
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)
