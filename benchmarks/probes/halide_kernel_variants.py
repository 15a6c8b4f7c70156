"""Hand-edited variants of one generated Halide kernel, timed through smelt's own launcher (issue 23):
the way to try a schedule before teaching it to codegen/halide/schedule.py. Each file is a kernel
source as SMELT_DEBUG_DIR writes it (edit its schedule lines); all are built, checked against the
first file's outputs, then timed in interleaved rounds of 50 calls (median us a call); with --cold, each call
after the caches are evicted.

    python -m benchmarks.probes.halide_kernel_variants --inputs 131072,131072,256 --outputs 131072,131072 \
        --sizes 512,256 rms.py rms_fused.py

--inputs / --outputs give each buffer's element count, in the kernel's INPUTS / OUTPUTS order (the
wrapper's call line shows which tensors they are); --sizes the kernel's SIZES (xnumel, rnumel). Inputs
are float32 in [0.5, 1.5): a kernel reading other dtypes needs its own harness.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from smelt.runtime.halide_launcher import HalideLauncher


def _counts(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--outputs", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cold", action="store_true",
                        help="evict the caches before each call (64 MB written), as a model's first kernel finds them;"
                             " times only the kernel")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    inputs = [torch.rand(n) + 0.5 for n in _counts(args.inputs)]
    sizes = _counts(args.sizes)
    cache = tempfile.mkdtemp(prefix="smelt-kernel-variants-")
    kernels, outputs = {}, {}
    for path in args.files:
        source = open(path).read()
        name = next(line[4:line.index("(")] for line in source.splitlines() if line.startswith("def halide_"))
        kernels[path] = HalideLauncher(name, source, [], cache, path=path)
        outputs[path] = [torch.empty(n) for n in _counts(args.outputs)]
        kernels[path](*inputs, *outputs[path], *sizes)
    first = args.files[0]
    for path in args.files[1:]:
        diff = max((a - b).abs().max().item() for a, b in zip(outputs[first], outputs[path]))
        print(f"{path}: max abs difference from {first}: {diff:.3g}")
    times = {path: [] for path in args.files}
    evict = torch.empty(16 << 20)
    for _ in range(args.rounds):
        for path, kernel in kernels.items():
            out = outputs[path]
            if args.cold:
                for _ in range(5):
                    evict.fill_(1.0)
                    start = time.perf_counter()
                    kernel(*inputs, *out, *sizes)
                    times[path].append((time.perf_counter() - start) * 1e6)
                continue
            start = time.perf_counter()
            for _ in range(50):
                kernel(*inputs, *out, *sizes)
            times[path].append((time.perf_counter() - start) / 50 * 1e6)
    for path in args.files:
        print(f"{statistics.median(times[path]):8.1f} us  {path}")


if __name__ == "__main__":
    main()
