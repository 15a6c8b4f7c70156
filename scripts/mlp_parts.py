"""Where the CPU mlp row's time goes (benchmarks/cpu_workloads.py, 512x512 -> 2048 -> 512 fp32):
each ATen call alone, and addmm against mm, median milliseconds on this machine's threads.

    python3 scripts/mlp_parts.py [--threads 2]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.cpu_workloads import _mlp_inputs, mlp  # noqa: E402
from benchmarks.measure import bench_ms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    torch.set_num_threads(parser.parse_args().threads)
    x, w1, b1, w2, b2 = _mlp_inputs((512, 512), torch.float32, "cpu")
    h = F.linear(x, w1, b1)
    parts = {
        "whole mlp": lambda: mlp(x, w1, b1, w2, b2),
        "linear 1 (addmm)": lambda: torch.addmm(b1, x, w1.t()),
        "linear 1 without bias (mm)": lambda: torch.mm(x, w1.t()),
        "gelu": lambda: F.gelu(h),
        "linear 2 (addmm)": lambda: torch.addmm(b2, h, w2.t()),
        "linear 2 without bias (mm)": lambda: torch.mm(h, w2.t()),
    }
    for name, fn in parts.items():
        print(f"{name:28s} {bench_ms(fn, 'cpu', warmup=50, rep=400):7.3f} ms")


if __name__ == "__main__":
    main()
