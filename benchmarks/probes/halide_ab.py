"""A/B timing of schedule or algorithm variants of one generated Halide kernel, in one process.

    SMELT_DEBUG_DIR=/tmp/k python3 -m benchmarks.run --device cpu --only softmax --no-compile-time
    python3 -m benchmarks.probes.halide_ab /tmp/k/graph_*/halide_red_*.py --threads 2 \\
        'rows32=out_ptr0_row, 8, hl=>out_ptr0_row, 32, hl'

Each variant is the kernel's source with text replacements (`name=old=>new;;old2=>new2`), or another
kernel's file (`--also PATH`, e.g. the same graph's kernel from an older commit). All are JIT-compiled
for the host as smelt compiles them (StrictFloat unless the kernel declares STRICT_FLOAT = False) and
called in alternation on the same inputs (float32 randn, one buffer of xnumel * rnumel elements per
parameter). Each variant writes its own outputs, allocated once: a fresh 16 MB output per call
would time the kernel's page faults, as many as its work. Medians and minima come from the same
rounds, so the machine's drift between
runs, which reaches ±30% on the 2-core CPU, touches every variant alike. Sizes must be static:
the kernel's source must print xnumel (and rnumel) as literals.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import sys
import tempfile
import time


def variants(source: str, specs: list[str], files: list[str]) -> dict[str, str]:
    texts = {"orig": source}
    for path in files:
        texts[os.path.splitext(os.path.basename(path))[0]] = open(path).read()
    for spec in specs:
        name, replacements = spec.split("=", 1)
        text = source
        for pair in replacements.split(";;"):
            old, new = pair.split("=>")
            if old not in text:
                sys.exit(f"variant {name}: {old!r} is not in the kernel's source")
            text = text.replace(old, new)
        texts[name] = text
    return texts


def load(name: str, text: str, folder: str):
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(f"variant_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel")
    parser.add_argument("variants", nargs="*", metavar="NAME=OLD=>NEW")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--also", action="append", default=[], metavar="PATH", help="another kernel file to time")
    args = parser.parse_intermixed_args()
    os.environ["HL_NUM_THREADS"] = str(args.threads)  # read when Halide's pool starts
    import halide as hl
    import torch

    source = open(args.kernel).read()
    sizes = [int(n) for n in re.findall(r"^\s+[xr]numel = hl\.Expr\((\d+)\)", source, re.M)]
    if not sizes:
        sys.exit("the kernel's sizes are not static (no `xnumel = hl.Expr(...)` line)")
    elements = 1
    for n in sizes:
        elements *= n
    host = hl.get_host_target()
    compiled = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, text in variants(source, args.variants, args.also).items():
            module = load(name, text, folder)
            kernel = next(v for k, v in vars(module).items() if k.startswith("halide_") and callable(v))
            pipeline, arguments = kernel()
            strict = getattr(module, "STRICT_FLOAT", True)  # as smelt's compile reads it
            pipeline.compile_jit(host.with_feature(hl.TargetFeature.StrictFloat) if strict else host)
            compiled[name] = (pipeline, arguments)
    torch.manual_seed(0)
    first = compiled["orig"][1]
    inputs = [torch.randn(elements) for a in first if isinstance(a, hl.ImageParam)]
    outputs = len(vars(module)["OUTPUTS"])
    times = {name: [] for name in compiled}
    results = {}
    for _ in range(args.rounds):
        for name, (pipeline, arguments) in compiled.items():
            images = [a for a in arguments if isinstance(a, hl.ImageParam)]
            for image, tensor in zip(images, inputs):
                image.set(hl.Buffer(tensor.numpy()))
            fresh = results.setdefault(name, [torch.empty(elements) for _ in range(outputs)])
            buffers = [hl.Buffer(t.numpy()) for t in fresh]
            start = time.perf_counter()
            pipeline.realize(buffers)
            times[name].append(time.perf_counter() - start)
    print(f"{args.kernel}: {args.threads} thread(s), {args.rounds} rounds")
    for name, seconds in times.items():
        differs = max(float(((a - b).abs() / (b.abs() + 1e-6)).max()) for a, b in zip(results[name], results["orig"]))
        print(f"{name:14} median {statistics.median(seconds) * 1e3:.3f} ms  min {min(seconds) * 1e3:.3f} ms  "
              f"max rel. diff from orig {differs:.1e}")


if __name__ == "__main__":
    main()
