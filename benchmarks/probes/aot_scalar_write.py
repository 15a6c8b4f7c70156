"""A torch fault, not smelt's (torch 2.13, CPU build): a 0-d float64 input updated in place by a 0-d
float32 input's new value (`lr.mul_(0.5); wd.add_(lr)`) is never written back under AOTAutograd:
backends aot_eager, inductor and smelt all leave it unchanged; backend eager (Dynamo alone) writes
it. With both inputs float32 every backend writes it.

    python -m benchmarks.probes.aot_scalar_write [float64|float32]
"""
import sys, torch
DT = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float64

def f(lr, wd):
    lr.mul_(0.5)
    wd.add_(lr)
    return lr * 2

for backend in ("eager", "aot_eager", "inductor", "smelt"):
    if backend == "smelt":
        import smelt  # noqa: F401
    torch._dynamo.reset()
    lr, wd = torch.tensor(0.4), torch.tensor(0.1, dtype=DT)
    torch.compile(f, backend=backend, fullgraph=True)(lr, wd)
    print(f"{backend:9s} lr {lr.item():.4f} wd {wd.item():.4f}  (eager: lr 0.2000 wd 0.3000)")
