"""`python -m smelt demo`: compile a small model, check it against eager, show speed and a kernel.
`python -m smelt report SCRIPT.py`: run a script under smelt, write an HTML page of what was compiled."""
from __future__ import annotations

import argparse
import sys
import time

import torch


def _timed_ms(fn, min_seconds: float = 1.0, min_repeats: int = 10) -> list[float]:
    """Times of back-to-back calls, in ms, for at least `min_seconds` and `min_repeats` calls."""
    times = []
    deadline = time.perf_counter() + min_seconds
    while len(times) < min_repeats or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)


def _steady(times: list[float]) -> str:
    """The median, and the middle half of the calls as the spread."""
    n = len(times)
    return f"{times[n // 2]:.3f} ms (middle half {times[n // 4]:.3f}-{times[(3 * n) // 4]:.3f}, {n} calls)"


def _kernel_body(source: str) -> str:
    """The kernel's own function, without the helpers a generated module defines before it."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(("def triton_", "def halide_", "@triton.jit"))]
    return "\n".join(lines[starts[0]:] if starts else lines)


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
    from smelt.graph_cache import stats as cache_stats
    hits_before = cache_stats["dynamo_hit"] + cache_stats["aten_hit"]
    compiled = torch.compile(model, backend="smelt")
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(x)
        compile_s = time.perf_counter() - start
        expected = model(x)
    warm = cache_stats["dynamo_hit"] + cache_stats["aten_hit"] > hits_before
    error = (out - expected).abs().max().item()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    cache = ("warm: read from the graph cache in " + smelt.config.current().cache_dir if warm
             else "cold: compiled now, kept in the graph cache for the next run")
    print(f"matches eager: max abs difference {error:.2e}; compile + first call {compile_s:.2f} s ({cache})")

    with torch.no_grad():
        eager = _timed_ms(lambda: model(x))
        ours = _timed_ms(lambda: compiled(x))
    print(f"time per call: eager {_steady(eager)}")
    print(f"               smelt {_steady(ours)}")
    print(f"smelt/eager speedup {eager[len(eager) // 2] / ours[len(ours) // 2]:.2f}x (medians)")

    graph = smelt.observe.compiled_graphs()[-1]
    aten = f", {len(graph.fallback_ops)} ATen calls ({', '.join(sorted(set(graph.fallback_ops)))})" \
        if graph.fallback_ops else ""
    print(f"\ncompiled: 1 graph, {len(graph.kernel_names)} kernels ({', '.join(graph.kernel_names)}){aten}")
    name = min(graph.kernel_names, key=lambda n: len(_kernel_body(graph.kernel_sources[n])))
    print(f"\n--- the shortest kernel, {name} (all of it: {graph.kernel_paths[name]}) ---")
    print(_kernel_body(graph.kernel_sources[name]))
    print("\nA page of every graph, kernel and timing of your own program: python -m smelt report your_script.py")


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
