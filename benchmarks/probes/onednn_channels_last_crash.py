"""Which bfloat16 channels-last convolutions oneDNN's CPU kernel dies on (signal 11): each shape runs
in a forked process, and the crashes are listed. RESULTS 2026-11-27 (seventh session): 69 of the
3,024 shapes below, every one with a stride and a dilation above 1; `lowering/layout_plan.py` keeps
such convolutions in NCHW on the CPU.

    python -m benchmarks.probes.onednn_channels_last_crash [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import itertools
import os

import torch


def crashes(dtype: torch.dtype, channels: int = 4) -> tuple[int, list]:
    torch.set_num_threads(1)
    tried, found = 0, []
    for h, w, k, s, p, d in itertools.product((1, 2, 4, 7), (1, 2, 4, 7), (1, 2, 3), (1, 2, 3, 4), (0, 1, 2, 3, 4),
                                              (1, 2, 3, 4)):
        if h + 2 * p < d * (k - 1) + 1 or w + 2 * p < d * (k - 1) + 1:
            continue  # no output: ATen refuses the shape
        tried += 1
        pid = os.fork()
        if pid == 0:
            x = torch.randn(1, channels, h, w, dtype=dtype).contiguous(memory_format=torch.channels_last)
            weight = torch.randn(channels, channels, k, k, dtype=dtype)
            torch.convolution(x, weight, None, [s, s], [p, p], [d, d], False, [0, 0], 1)
            os._exit(0)
        if os.waitpid(pid, 0)[1] != 0:
            found.append(dict(H=h, W=w, kernel=k, stride=s, padding=p, dilation=d))
    return tried, found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    tried, found = crashes(getattr(torch, args.dtype))
    print(f"torch {torch.__version__}, {args.dtype}: {len(found)} of {tried} shapes crashed")
    for shape in found:
        print(" ", shape)
    if found:
        print("all with stride > 1 and dilation > 1:", all(c["stride"] > 1 and c["dilation"] > 1 for c in found))


if __name__ == "__main__":
    main()
