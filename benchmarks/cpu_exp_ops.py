"""CPU time of the exp-heavy rows the Halide backend's one float32 exp and per-element division
change (benchmarks/RESULTS.md, 2026-11-26 evening): median of 60 calls, 2 threads, 2048x2048 float32.

    SMELT_CPU_BACKEND=halide python -m benchmarks.cpu_exp_ops
"""
import time

import torch

import smelt  # noqa: F401  (registers the backend)

ROWS = {
    "softmax": lambda a, y: torch.softmax(a, -1),
    "div_rowsum": lambda a, y: a / a.sum(-1, keepdim=True),
    "exp": lambda a, y: a.exp(),
    "exp_mul": lambda a, y: a.exp() * y + 1,
    "logsumexp": lambda a, y: torch.logsumexp(a, -1),
    "silu": lambda a, y: torch.nn.functional.silu(a),
}


def main(calls: int = 60) -> None:
    torch.set_num_threads(2)
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for name, fn in ROWS.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="smelt")
        for _ in range(5):
            compiled(x, y)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            compiled(x, y)
            times.append(time.perf_counter() - start)
        times.sort()
        print(f"{name:12s} {times[len(times) // 2] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
