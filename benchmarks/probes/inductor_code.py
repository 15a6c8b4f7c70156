"""Print the code Inductor generates for benchmark workloads (its wrapper and Triton kernels), to
compare with smelt's on the same GPU.

    TORCH_LOGS=output_code python3 -m benchmarks.probes.inductor_code var_mean global_sum 2> inductor.txt
"""
from __future__ import annotations

import sys

import torch


from benchmarks.workloads import by_name  # noqa: E402

if __name__ == "__main__":
    for name in sys.argv[1:]:
        (workload,) = by_name(name)
        inputs = workload.make_inputs("cuda")
        print(f"===== {name}", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(workload.fn)(*inputs)
        torch.cuda.synchronize()
