"""Peak memory of one decode step (one token, transformers' DynamicCache) on the GPU, eager against
Dynamo alone (backend "eager": its captured graph run by eager, no compiler), smelt and Inductor.

Issue 22 asks for a peak at or under eager's on every model; compiled decode steps peak far over
eager's for Inductor and smelt alike (RESULTS, thirtieth session). The cache's per-layer torch.cat
makes new key and value tensors; eager frees each layer's old ones as it goes, but in a captured graph
they are inputs the caller holds (the cache's layers keep them until Dynamo writes the new ones back,
after the graph returns), so every layer's old and new caches are alive together. If Dynamo alone
peaks there too, the excess is the capture's, not a compiler's.

The peak is the caching allocator's (torch.cuda.max_memory_allocated) over its level before the call.
On the CPU torch.profiler's allocation events leave out frees of memory allocated before the call, so
they cannot see eager freeing the old cache: this probe runs on CUDA only (an earlier CPU version of
it, 2026-12-01, reported Dynamo alone at eager's peak for that reason).

    python -m benchmarks.probes.decode_peak [--models llama,qwen2,gpt2] [--size real]
"""
from __future__ import annotations

import argparse

import torch


def step_peak(step) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,qwen2,gpt2")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--backends", default="eager,smelt,inductor",
                        help="compiled backends measured against plain eager ('eager' is Dynamo alone)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_peak: needs CUDA (the CPU profiler's events miss frees of older memory)")
    import smelt  # noqa: F401
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    backends = args.backends.split(",")
    print("| model | plain eager MiB | " + " | ".join(f"{b} MiB (vs eager)" for b in backends) + " |")
    print("| --- | --- |" + " --- |" * len(backends))
    for name in args.models.split(","):
        peaks = {}
        for backend in [None] + backends:
            torch._dynamo.reset()
            step = case_callable(all_specs()[name], "decode", args.size, "cuda", 0, backend)
            step()  # compiles
            step()
            peaks[backend] = step_peak(step)
            del step
        eager = peaks[None]
        cells = " | ".join(f"{peaks[b] / 2**20:.1f} ({peaks[b] / eager:.2f}x)" for b in backends)
        print(f"| {name} | {eager / 2**20:.1f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
