"""Host time per call (200 calls back to back) and do_bench median of named benchmark workloads,
Inductor against smelt, on the GPU: python -m benchmarks.probes.launch_overhead NAME [NAME ...]."""
import sys, time, torch
from benchmarks.workloads import by_name
from benchmarks.backends import compile_fn
from triton.testing import do_bench
for name in sys.argv[1:]:
    (w,) = by_name(name)
    inputs = w.make_inputs("cuda")
    for backend in ("inductor", "smelt"):
        f = compile_fn(backend, w.fn)
        for _ in range(3): f(*inputs)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200): f(*inputs)
        cpu = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"{name:18s} {backend:9s} cpu/call {cpu:7.1f} us   do_bench {do_bench(lambda: f(*inputs), return_mode='median')*1e3:8.1f} us", flush=True)
