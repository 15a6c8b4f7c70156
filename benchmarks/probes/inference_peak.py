"""An inference call's peak memory on the CPU, eager against Inductor and smelt, for a model-suite case
(issue 22's peaks, worked where the GPU is not lent): the allocator's peak over the call, from the
profiler's allocation events (`cpu_peak_memory.allocations_of`). The CPU workspace is turned off so
smelt's call-local buffers are counted as the GPU counts them.

    python -m benchmarks.probes.inference_peak t5_encoder --mode infer_bf16 --batch 2 --seq 512 --sdpa-math

--sdpa-math runs SDPA's math backend, as the H200 ran T5's attention (its traced graph held the math path,
likely for T5's position-bias mask, whose last dimension has stride 8).
"""
from __future__ import annotations

import argparse
import contextlib
import os


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--mode", default="infer_fp32", choices=("infer_fp32", "infer_bf16"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--sdpa-math", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("SMELT_CPU_WORKSPACE", "0")
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import smelt  # noqa: F401
    from smelt.tools.model_suite import zoo_text
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs

    from .cpu_peak_memory import allocations_of
    zoo_text.BATCH["real"], zoo_text.SEQ["real"] = args.batch, args.seq
    spec = all_specs()[args.model]
    with sdpa_kernel(SDPBackend.MATH) if args.sdpa_math else contextlib.nullcontext():
        for backend in (None, "inductor", "smelt"):
            torch._dynamo.reset()
            call = case_callable(spec, args.mode, "real", "cpu", 0, backend)
            call()
            call()
            _, peak, _ = allocations_of(call)
            print(f"{args.model} {args.mode} {backend or 'eager'}: peak {peak / 2 ** 20:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
