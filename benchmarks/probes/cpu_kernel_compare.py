"""smelt's and Inductor's own kernels of one CPU model side by side (issue 23): both compiled in one
process, profiled over the same calls (Inductor's C++ kernels named through
`torch._inductor.config.cpp.enable_kernel_profile`), each op's self time a call.

    python -m benchmarks.probes.cpu_kernel_compare mobilenetv3 [--top 30] [--calls 10]

The first line of each compiler gives its own kernels' total and launches; the rest lists the
costliest entries (kernels, ATen's library calls), so a kernel of smelt's that is slower than
Inductor's counterpart, or a library call one compiler makes and the other does not, shows.

The two are not named alike: Inductor's kernels record themselves in C++, smelt's launcher wraps
each Halide call in Python's `record_function`, whose own cost lands in the kernel's self time (an
empty one reads 7.5 us; MobileNetV3's 32-element ReLU read 17-31 us profiled against a 6.6 us
launch timed without the profiler). Each compiler's line also gives its kernels net of an empty
`record_function`'s self time, measured here, per launch (smelt's only): still an upper bound.
"""
from __future__ import annotations

import argparse
import collections

import torch

from benchmarks.cpu_models import build

OWN_KERNEL_PREFIXES = ("halide_", "cpp_fused", "graph_")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    import torch._inductor.config as inductor_config
    inductor_config.cpp.enable_kernel_profile = True
    empty_us = _empty_record_function_us()
    print(f"an empty record_function: {empty_us:.1f} us of self time")
    model, inputs = build(args.model)
    compiled = {"inductor": torch.compile(model), "smelt": torch.compile(model, backend="smelt")}
    with torch.no_grad():
        for fn in compiled.values():
            for _ in range(3):
                fn(*inputs)
        for name, fn in compiled.items():
            with torch.profiler.profile() as profile:
                for _ in range(args.calls):
                    fn(*inputs)
            own_us, count = collections.Counter(), collections.Counter()
            for event in profile.key_averages():
                own_us[event.key] += event.self_cpu_time_total / args.calls
                count[event.key] += event.count / args.calls
            own = [k for k in own_us if k.startswith(OWN_KERNEL_PREFIXES)]
            launches = sum(count[k] for k in own)
            total = sum(own_us[k] for k in own)
            net = total - (launches * empty_us if name == "smelt" else 0.0)
            print(f"== {name}: own kernels {total / 1e3:.2f} ms in {launches:.0f} launches "
                  f"({net / 1e3:.2f} ms net of the profiler's Python wrapper); "
                  f"all self time {sum(own_us.values()) / 1e3:.2f} ms")
            for key, us in own_us.most_common(args.top):
                print(f"  {us:9.1f} us  x{count[key]:.0f}  {key[:90]}")


def _empty_record_function_us(calls: int = 500) -> float:
    with torch.profiler.profile() as profile:
        for _ in range(calls):
            with torch.profiler.record_function("empty"):
                pass
    events = [e for e in profile.events() if e.name == "empty"]
    return sorted(e.self_cpu_time_total for e in events)[len(events) // 2]


if __name__ == "__main__":
    main()
