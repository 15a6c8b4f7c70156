"""addmm followed by GELU (tanh) or ReLU, against ATen's _addmm_activation, whose cuBLASLt
epilogue applies the activation before the product is written (measures the case for rewriting).

    python3 -m benchmarks.probes.gemm_epilogue
    python3 -m benchmarks.probes.gemm_epilogue --cpu   # erf GELU, ATen applying it in place (the CPU mlp row)
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

aten = torch.ops.aten
torch.manual_seed(0)


def cpu_case(threads: int, rounds: int = 100) -> None:
    """The CPU mlp row's first layer, 512x512 @ 512x2048 with erf GELU, alternating calls."""
    torch.set_num_threads(threads)
    x, w, b = torch.randn(512, 512), torch.randn(2048, 512) / 512 ** 0.5, torch.randn(2048)
    cases = {"separate": lambda: F.gelu(aten.addmm(b, x, w.t())),
             "in the call": lambda: aten._addmm_activation(b, x, w.t(), use_gelu=True)}
    assert torch.equal(cases["separate"](), cases["in the call"]()), "not bit for bit eager's"
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(f"{threads} thread(s): " + ", ".join(f"{name} {statistics.median(t) * 1e3:.2f} ms" for name, t in times.items()))


if "--cpu" in sys.argv:
    for threads in (1, torch.get_num_threads()):
        cpu_case(threads)
    sys.exit()

from triton.testing import do_bench  # noqa: E402
a = torch.randn(256, 128, device="cuda"); w = torch.randn(128, 512, device="cuda"); b = torch.randn(512, device="cuda")
y = aten._addmm_activation(b, a, w, use_gelu=True).double()
z = torch.addmm(b, a, w).double()
print("fp32 fused GELU against tanh:", (y - F.gelu(z, approximate="tanh")).abs().max().item(),
      "against erf:", (y - F.gelu(z)).abs().max().item())
for m, k, n in ((8192, 1024, 4096), (8192, 4096, 1024), (2048, 768, 3072), (512, 1024, 4096)):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        wt = w.t()
        for act in ("gelu", "relu"):
            def separate():
                y = aten.addmm(b, a, wt)
                return F.gelu(y, approximate="tanh") if act == "gelu" else F.relu(y)
            def fused():
                return aten._addmm_activation(b, a, wt, use_gelu=act == "gelu")
            ref = separate().float()
            exact = (a.double() @ wt.double() + b.double())
            exact = F.gelu(exact, approximate="tanh") if act == "gelu" else F.relu(exact)
            err_sep = (ref - exact).abs().max().item()
            err_fused = (fused().float() - exact).abs().max().item()
            t_sep = do_bench(separate, return_mode="median")
            t_fused = do_bench(fused, return_mode="median")
            print(f"{m}x{k}x{n} {str(dtype)[6:]:9s} {act}: separate {t_sep*1e3:7.1f} us fused {t_fused*1e3:7.1f} us"
                  f" ({t_sep/t_fused:.2f}x); max err vs fp64: separate {err_sep:.3g} fused {err_fused:.3g}", flush=True)
