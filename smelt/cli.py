"""`python -m smelt demo`: compile a small model, check it against eager, show speed and a kernel.
`python -m smelt report SCRIPT.py`: run a script under smelt, write an HTML page of what was compiled."""
from __future__ import annotations

import argparse
import sys
import time

import torch


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


class DemoBlock(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear -> softmax: norms, matmuls and fusable elementwise work."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(h + x, dim=-1)


def demo() -> None:
    import smelt
    from smelt.codegen import backends

    device = "cuda" if torch.cuda.is_available() else "cpu"
    interpreted = backends.for_device(smelt.config.current(), torch.device(device)).interprets(device)
    batch, width = (64, 128) if interpreted else (4096, 1024) if device == "cuda" else (1024, 512)
    torch.manual_seed(0)
    model = DemoBlock(width).to(device).eval()
    x = torch.randn(batch, width, device=device)
    print(f"smelt demo on {device}: {type(model).__name__} with input [{batch}, {width}], torch {torch.__version__}")
    if interpreted:
        print("(SMELT_CPU_BACKEND=triton runs the Triton kernels through Triton's interpreter: this checks the "
              "generated code, it is not fast)")

    smelt.observe.reset()
    compiled = torch.compile(model, backend="smelt")
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(x)
        compile_s = time.perf_counter() - start
        expected = model(x)
    error = (out - expected).abs().max().item()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    print(f"matches eager: max abs difference {error:.2e}; compile + first call {compile_s:.2f} s")

    repeat = 20 if device == "cuda" else 3
    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(x), repeat)
        smelt_ms = _median_ms(lambda: compiled(x), repeat)
    print(f"median time per call: eager {eager_ms:.3f} ms, smelt {smelt_ms:.3f} ms "
          f"(smelt/eager speedup {eager_ms / smelt_ms:.2f}x)")

    graph = smelt.observe.compiled_graphs()[-1]
    print(f"\n{len(graph.kernel_names)} kernels: {', '.join(graph.kernel_names)}")
    if graph.fallback_ops:
        print(f"ran through ATen: {', '.join(graph.fallback_ops)}")
    name = max(graph.kernel_names, key=lambda n: len(graph.kernel_sources[n]))
    print(f"\n--- {name} ({graph.kernel_paths[name]}) ---")
    print(graph.kernel_sources[name])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="smelt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile a small model, check it against eager, print speed and a kernel")
    report = sub.add_parser("report", help="run a script under smelt and write an HTML page of what was compiled")
    report.add_argument("script", help="the program to run; its own arguments follow a --")
    report.add_argument("--out", default="smelt_report.html")
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "demo":
        demo()
    elif args.command == "report":
        from smelt.report import run_script
        written = run_script(args.script, script_args, args.out)
        print(f"smelt report: {len(written.graphs)} graphs, {len(written.kernels)} kernels, "
              f"{len(written.graph_breaks)} graph break reasons -> {args.out}")


if __name__ == "__main__":
    main()
