"""What eager's correctly rounded float32 division and square root cost a real model on the GPU
(issue 22): the model suite's models under gpu_model_profile, one variant of smelt's Triton spellings
per process (give each an empty SMELT_CACHE_DIR).

    python -m benchmarks.probes.division_precision exact efficientnet mobilenetv3 --no-inductor

Variants: default (smelt's: approximate where eager rounds the value to a half float,
lowering/half_rounding.py), exact (correctly rounded everywhere, smelt's spelling before that),
approx_div (every float32 `/`, reciprocal and sigmoid Triton's approximate `/`, Inductor's spelling),
approx_div_sqrt (also libdevice.sqrt for every sqrt). The rest of the arguments go to
gpu_model_profile.
"""
from __future__ import annotations

import sys

from benchmarks.probes import gpu_model_profile
from smelt.codegen.triton import handler, ops
from smelt.lowering import half_rounding

VARIANTS = ("default", "exact", "approx_div", "approx_div_sqrt")


def apply(variant: str) -> None:
    if variant not in VARIANTS:
        raise SystemExit(f"variant {variant!r}: one of {', '.join(VARIANTS)}")
    if variant == "exact":
        half_rounding._rounded = lambda node, memo, depth: False
    if variant.startswith("approx_div"):
        handler.FLOAT32_DIV = "({0} / {1})"
        ops.FLOAT32_UNARY["reciprocal"] = "1.0 / {0}"
        ops.FLOAT32_UNARY["sigmoid"] = "1.0 / (1.0 + %s)" % ops.EXP.format("-{0}")
    if variant == "approx_div_sqrt":
        ops.FLOAT32_UNARY["sqrt"] = "libdevice.sqrt({0})"


if __name__ == "__main__":
    apply(sys.argv[1])
    print(f"variant {sys.argv[1]}")
    gpu_model_profile.main(sys.argv[2:])
