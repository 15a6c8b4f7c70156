"""Why the transformer block row is sometimes 0.82x: time it (CPU per call, do_bench) in a fresh
process, then again after every other workload ran in the same process (as benchmarks.run does),
with a cProfile of smelt's calls in that state.

    python3 -m benchmarks.probes.transformer_state
"""
import cProfile
import gc
import pstats
import time

import torch
from triton.testing import do_bench

from benchmarks.backends import compile_fn
from benchmarks.workloads import WORKLOADS, by_name


def measure(label, f, inputs):
    for _ in range(3):
        f(*inputs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        f(*inputs)
    cpu = (time.perf_counter() - start) / 200 * 1e6
    torch.cuda.synchronize()
    print(f"{label:40s} cpu/call {cpu:7.1f} us  do_bench {do_bench(lambda: f(*inputs), return_mode='median') * 1e3:7.1f} us",
          flush=True)


(block,) = by_name("transformer_block")
inputs = block.make_inputs("cuda")
for backend in ("inductor", "smelt"):
    measure(f"fresh process, {backend}", compile_fn(backend, block.fn), inputs)
for w in WORKLOADS:
    if w.name == "transformer_block":
        continue
    other = w.make_inputs("cuda")
    for backend in ("inductor", "smelt"):
        f = compile_fn(backend, w.fn)
        f(*other)
        do_bench(lambda: f(*other), return_mode="median")
    del other, f
    gc.collect()
inputs = block.make_inputs("cuda")
for backend in ("inductor", "smelt"):
    f = compile_fn(backend, block.fn)
    measure(f"after every workload, {backend}", f, inputs)
profile = cProfile.Profile()
profile.enable()
for _ in range(100):
    f(*inputs)
torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(12)
