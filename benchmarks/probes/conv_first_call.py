"""What a convolution's first call in a process costs (cuDNN builds its plan then; a warm start pays
it again for every shape): EfficientNet-B0's depthwise convolutions, bfloat16, batch 32, channels-last
against NCHW, one after another or from a pool of threads. Each row is a fresh process.

    python -m benchmarks.probes.conv_first_call [--threads 1 16] [--part forward|backward|weight]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

# (channels, input size, kernel, stride) of EfficientNet-B0's depthwise convolutions.
SHAPES = [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 5, 2), (240, 28, 5, 1), (240, 28, 3, 2),
          (480, 14, 3, 1), (480, 14, 5, 1), (672, 14, 5, 1), (672, 14, 5, 2), (1152, 7, 5, 1), (1152, 7, 3, 1)]

CHILD = r"""
import sys, time, torch
from concurrent.futures import ThreadPoolExecutor
layout, threads, shapes, part = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3]), sys.argv[4]
fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
def make(c, size, k, s):
    x = torch.randn(32, c, size, size, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    w = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    forward = lambda: torch.convolution(x, w, None, (s, s), (k // 2, k // 2), (1, 1), False, (0, 0), c)
    if part == "forward":
        return forward
    dy = torch.randn_like(forward())
    # The backward a training step runs: the input's and the weight's gradients in one call, or
    # ("weight") the weight's alone, as under SMELT_DEPTHWISE_WEIGHT_GRADIENT=library.
    mask = (True, True, False) if part == "backward" else (False, True, False)
    return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, (s, s), (k // 2, k // 2), (1, 1), False,
                                                       (0, 0), c, mask)
calls = [make(*shape) for shape in shapes]
torch.nn.functional.conv2d(torch.randn(1, 3, 8, 8, device="cuda"), torch.randn(4, 3, 3, 3, device="cuda"))
torch.cuda.synchronize()
def timed(rounds):
    start = time.perf_counter()
    if threads == 1:
        for call in calls:
            call()
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda call: call(), calls))
    torch.cuda.synchronize()
    return time.perf_counter() - start
first = timed(1)
again = timed(2)
print(f"{first:.3f} {again:.4f}")
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--part", choices=("forward", "backward", "weight"), default="forward")
    args = parser.parse_args(argv)
    print(f"{len(SHAPES)} depthwise convolutions' {args.part}, bf16, batch 32\n")
    print("| layout | threads | first calls s | second calls s |\n| --- | --- | --- | --- |")
    for layout in ("channels_last", "contiguous"):
        for threads in args.threads:
            done = subprocess.run([sys.executable, "-c", CHILD, layout, str(threads), repr(SHAPES), args.part],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                print(f"| {layout} | {threads} | failed: {done.stderr.strip()[-300:]} | |")
                continue
            first, again = done.stdout.split()
            print(f"| {layout} | {threads} | {first} | {again} |", flush=True)


if __name__ == "__main__":
    main()
