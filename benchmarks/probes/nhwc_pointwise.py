"""A BatchNorm + hardswish over a channels-last activation on the CPU: eager against smelt, median of
30 calls each in one process (the kernel issue 23's row walk over rows of C is for).

    python -m benchmarks.probes.nhwc_pointwise [--shape 8 96 56 56]
"""
from __future__ import annotations

import argparse

import torch

import smelt  # noqa: F401  (registers the backend)
from benchmarks.measure import median_call_ms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, default=[8, 96, 56, 56])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    channels = args.shape[1]
    bn = torch.nn.BatchNorm2d(channels).eval()
    bn.running_var.uniform_(0.5, 2)
    bn.running_mean.normal_()

    def f(x):
        return torch.nn.functional.hardswish(bn(x))

    x = torch.randn(*args.shape).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        compiled = torch.compile(f, backend="smelt")
        torch.testing.assert_close(compiled(x), f(x))
        eager, ours = median_call_ms(f, (x,), 30, warmup=3), median_call_ms(compiled, (x,), 30, warmup=3)
    print(f"{tuple(args.shape)} channels-last float32, {torch.get_num_threads()} threads: eager {eager:.3f} ms, "
          f"smelt {ours:.3f} ms")


if __name__ == "__main__":
    main()
