"""torch.profiler's CUDA kernel table for one benchmark workload (default transformer_block), Inductor
then smelt, with smelt's debug dir under $OUT: python -m benchmarks.probes.profile_workload [NAME]."""
import os, sys, torch
from benchmarks.workloads import by_name
from benchmarks.backends import compile_fn
from torch.profiler import profile, ProfilerActivity
name = sys.argv[1] if len(sys.argv) > 1 else "transformer_block"
(w,) = by_name(name)
inputs = w.make_inputs("cuda")
out = os.environ.get("OUT", "/tmp")
os.environ["SMELT_DEBUG_DIR"] = os.path.join(out, "smelt_debug")
for backend in ("inductor", "smelt"):
    f = compile_fn(backend, w.fn)
    for _ in range(3): f(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10): f(*inputs)
        torch.cuda.synchronize()
    print("=====", backend)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
