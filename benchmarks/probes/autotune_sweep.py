"""Which block configs win when autotuning, per benchmark workload (to tune the heuristic).

    SMELT_AUTOTUNE=1 python3 -m benchmarks.probes.autotune_sweep softmax layer_norm ...
"""
import logging
import sys


from benchmarks.backends import compile_fn
from benchmarks.measure import bench_ms
from benchmarks.workloads import by_name

logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("smelt").setLevel(logging.DEBUG)
logging.getLogger("smelt").handlers = [logging.StreamHandler(sys.stdout)]
logging.getLogger("smelt").propagate = False
for w in by_name(",".join(sys.argv[1:]) or None):
    inputs = w.make_inputs("cuda")
    f = compile_fn("smelt", w.fn)
    f(*inputs)
    print(f"== {w.name}: {bench_ms(lambda: f(*inputs), 'cuda'):.4f} ms", flush=True)
