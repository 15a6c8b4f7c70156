"""Float32 products over a Linear's weight on this CPU: ATen's addmm / mm (MKL's sgemm) against
oneDNN's linear (smelt::onednn_linear), alone and with a ReLU or GELU post-op, over shapes from one row
to a whole batch; then whole models in eager with every nn.Linear through oneDNN.

    python -m benchmarks.probes.onednn_products [--models llama,bert]

Prints per shape the median microseconds of each (calls alternated), the ratio and the largest
difference between the two results; the choice smelt makes is runtime/onednn_linear.faster_in_onednn.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from smelt.runtime.onednn_linear import onednn_linear

SHAPES = ((1, 256, 256), (8, 256, 256), (64, 256, 256), (512, 256, 256), (512, 256, 688), (512, 688, 256),
          (512, 256, 1024), (512, 1024, 256), (1, 1024, 4096), (64, 1024, 4096), (2048, 768, 3072))


def _median_us(calls, rounds: int = 30) -> list[float]:
    for call in calls:
        call()
    times = [[] for _ in calls]
    for _ in range(rounds):
        for call, kept in zip(calls, times):
            start = time.perf_counter()
            call()
            kept.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e6 for t in times]


def products() -> None:
    print(f"threads {torch.get_num_threads()}")
    print("| rows x inner x columns | epilogue | ATen us | oneDNN us | ATen / oneDNN | max difference |")
    print("| --- | --- | --- | --- | --- | --- |")
    torch.manual_seed(0)
    for rows, inner, columns in SHAPES:
        x, w, b = torch.randn(rows, inner), torch.randn(columns, inner), torch.randn(columns)
        for epilogue, aten_call, activation in (
                ("bias", lambda: torch.addmm(b, x, w.t()), "none"),
                ("bias + relu", lambda: torch._addmm_activation(b, x, w.t()), "relu"),
                ("bias + gelu", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True), "gelu")):
            if epilogue != "bias" and rows * inner * columns > 1 << 28:
                continue
            def dnn(activation=activation):
                return onednn_linear(b, x, w.t(), activation)
            aten_us, dnn_us = _median_us((aten_call, dnn), rounds=30 if rows * inner * columns < 1 << 28 else 5)
            diff = (aten_call() - dnn()).abs().max().item()
            print(f"| {rows} x {inner} x {columns} | {epilogue} | {aten_us:.1f} | {dnn_us:.1f} | {aten_us / dnn_us:.2f}x "
                  f"| {diff:.1e} |")


def models(names: list[str]) -> None:
    from benchmarks.cpu_models import build
    print("| model | eager ms | eager, Linears through oneDNN ms | speed-up |")
    print("| --- | --- | --- | --- |")
    for name in names:
        model, inputs = build(name)
        original = torch.nn.Linear.forward
        through = lambda self, x: torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        results = []
        with torch.no_grad():
            for forward in (original, through):
                torch.nn.Linear.forward = forward
                try:
                    results.append(_median_us([lambda: model(*inputs)], rounds=15)[0] / 1e3)
                finally:
                    torch.nn.Linear.forward = original
        print(f"| {name} | {results[0]:.2f} | {results[1]:.2f} | {results[0] / results[1]:.2f}x |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,bert")
    args = parser.parse_args(argv)
    products()
    models([m for m in args.models.split(",") if m])


if __name__ == "__main__":
    main()
