"""CPU time of the exp-heavy rows the Halide backend's one float32 exp and per-element division
change (benchmarks/RESULTS.md, 2026-11-26 evening), and of its float64 erf fits (2026-11-26, night):
median of 60 calls, 2 threads, 2048x2048 float32, smelt then eager.

    SMELT_CPU_BACKEND=halide python -m benchmarks.cpu_exp_ops
"""
import torch

import smelt  # noqa: F401  (registers the backend)
from benchmarks.measure import median_call_ms

ROWS = {
    "softmax": lambda a, y: torch.softmax(a, -1),
    "div_rowsum": lambda a, y: a / a.sum(-1, keepdim=True),
    "exp": lambda a, y: a.exp(),
    "exp_mul": lambda a, y: a.exp() * y + 1,
    "logsumexp": lambda a, y: torch.logsumexp(a, -1),
    "silu": lambda a, y: torch.nn.functional.silu(a),
    "erf": lambda a, y: torch.erf(a),
    "erfc": lambda a, y: torch.erfc(a),
    "gelu": lambda a, y: torch.nn.functional.gelu(a),
}


def main(calls: int = 60) -> None:
    torch.set_num_threads(2)
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for name, fn in ROWS.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="smelt")
        smelt_ms, eager_ms = median_call_ms(compiled, (x, y), calls), median_call_ms(fn, (x, y), calls)
        print(f"{name:12s} smelt {smelt_ms:.3f} ms   eager {eager_ms:.3f} ms")


if __name__ == "__main__":
    main()
