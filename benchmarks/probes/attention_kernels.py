"""Which attention kernel each model's compiled graphs run (issue 22: attention): SDPA's fused
kernels (flash, memory-efficient, cuDNN, the CPU's flash) or a materialized softmax over a batched
product (SDPA's math path, or attention written by hand), counted in smelt's generated wrappers.

    python -m benchmarks.probes.attention_kernels [--models t5_encoder,bert] [--modes infer_bf16,train]
        [--device cuda] [--size tiny]

A row with `softmax after bmm` above zero is attention whose scores reach memory: the math path
(a mask SDPA's fused kernels refuse, lowering/attention_masks.py) or a model's own softmax(QK^T)V.
"""
from __future__ import annotations

import argparse
import collections
import re

import torch

FUSED = {
    "flash": "_scaled_dot_product_flash_attention(",
    "efficient": "_scaled_dot_product_efficient_attention(",
    "cudnn": "_scaled_dot_product_cudnn_attention(",
    "cpu flash": "_scaled_dot_product_flash_attention_for_cpu(",
}


def kernels_in(sources: list[str]) -> collections.Counter:
    counts = collections.Counter()
    for source in sources:
        for name, call in FUSED.items():
            counts[name] += source.count(call)
        # a bmm whose result a softmax-like kernel (amax / exp / sum) reads next: the scores in memory
        lines = source.splitlines()
        for k, line in enumerate(lines):
            match = re.match(r"\s*(buf\d+) = torch\.(bmm|baddbmm)\(", line)
            if match and any(match.group(1) in later and re.search(r"amax|exp|softmax", later)
                             for later in lines[k + 1:k + 12]):
                counts["softmax after bmm"] += 1
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert,gpt2,t5_encoder,llama,vit,swin,whisper,bart")
    parser.add_argument("--modes", default="infer_bf16,train")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="tiny", choices=("tiny", "real"))
    args = parser.parse_args(argv)
    import smelt.observe as observe
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    specs = all_specs()
    print("| model | mode | " + " | ".join(FUSED) + " | softmax after bmm |")
    print("| --- | --- | " + " | ".join("---" for _ in FUSED) + " | --- |")
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            torch._dynamo.reset()
            observe.reset()
            try:
                case_callable(specs[name], mode, args.size, args.device, 0, "smelt")()
            except Exception as e:  # a probe: report and go on
                print(f"| {name} | {mode} | failed: {type(e).__name__}: {str(e)[:80]} |")
                continue
            counts = kernels_in([g.wrapper_source for g in observe.compiled_graphs()])
            print(f"| {name} | {mode} | " + " | ".join(str(counts[k]) for k in FUSED)
                  + f" | {counts['softmax after bmm']} |", flush=True)


if __name__ == "__main__":
    main()
