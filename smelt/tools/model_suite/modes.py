"""The ways the suite runs a model, and which models each applies to."""
from __future__ import annotations

from .spec import ModelSpec

MODES = ("infer_fp32", "infer_bf16", "train", "dynamic", "decode")
DECODER_ONLY = ("dynamic", "decode")

# Sequence lengths the dynamic mode runs one compiled graph over (odd ones on purpose: no size is
# a power of two the kernels could have been specialized for).
DYNAMIC_SEQS = {"tiny": (6, 11, 16), "real": (128, 320, 512)}


def applies(spec: ModelSpec, mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes are {', '.join(MODES)}")
    return spec.is_decoder or mode not in DECODER_ONLY


def cases(specs, modes=MODES):
    """(spec, mode) pairs in zoo order."""
    return [(spec, mode) for spec in specs for mode in modes if applies(spec, mode)]
