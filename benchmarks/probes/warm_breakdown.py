"""Where a warm compile's time goes: the first call of a workload in a process whose caches are
warm, split into Dynamo's own work and smelt's steps (wall-clock timers around each).

    python3 -m benchmarks.probes.warm_breakdown [layer_norm softmax ...]

Each workload runs in three fresh processes that share brand-new cache folders: the first fills
the caches (cold), the next two read them (warm).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import collections, sys, time, torch
from benchmarks.backends import preload
from benchmarks.workloads import by_name
(w,) = by_name(sys.argv[1])
device = "cuda" if torch.cuda.is_available() else "cpu"
inputs = w.make_inputs(device, device == "cpu")
w.fn(*inputs)
preload("smelt")
spent = collections.defaultdict(float)

def timed(owner, name, label):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
    setattr(owner, name, wrapper)

from smelt import backend
from smelt.graph_cache import dynamo_level
from smelt.runtime import assemble, kernel_binaries, cuda_binary, launcher
timed(dynamo_level.DynamoCacheSlot, "__init__", "graph key (fingerprint)")
timed(dynamo_level.DynamoCacheSlot, "lookup", "cache lookup (incl. assemble)")
timed(dynamo_level, "load_generated", "  read the generated graph")
timed(dynamo_level, "assemble", "  assemble (load sources, wrapper)")
timed(kernel_binaries.KernelVariants, "_load_or_compile", "kernel binary read (or compile)")
timed(cuda_binary.CudaBinary, "load", "cuModuleLoadData")
timed(launcher.TritonLauncher, "__call__", "kernel launches")
timed(backend, "smelt_backend", "smelt backend (all)")
torch._dynamo.reset()
compiled = torch.compile(w.fn, backend=backend.smelt_backend)
if device == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
compiled(*inputs)
if device == "cuda":
    torch.cuda.synchronize()
total = time.perf_counter() - start
print(f"first call {total * 1e3:.1f} ms: " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in spent.items()))
"""


def main() -> None:
    names = sys.argv[1:] or ["layer_norm", "softmax"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=f"{cache}/triton", SMELT_CACHE_DIR=f"{cache}/smelt",
                       PYTHONPATH=root)
            for run in ("cold", "warm", "warm"):
                proc = subprocess.run([sys.executable, "-c", CHILD, name], cwd=root, env=env,
                                      capture_output=True, text=True, timeout=300)
                line = (proc.stdout.strip().splitlines() or [proc.stderr.strip()[-300:]])[-1]
                print(f"{name:12s} {run}: {line}", flush=True)


if __name__ == "__main__":
    main()
