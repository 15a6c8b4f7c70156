"""Combo pointer tables written on the GPU by a kernel (runtime/table_writer.py) against copied from
pinned memory (the path a CUDA graph's recording keeps), on a training step of the model suite
(issue 22): each variant compiled in turn in one process, then per step: the wall of 20 steps after
3, the tables built on the host and the time in building them, the writer's launches, and the
caching allocator's device mallocs meanwhile.

    python -m benchmarks.probes.pointer_tables_ab bert [copied,written,copied,written]
"""
from __future__ import annotations

import argparse
import time

import torch

import smelt  # noqa: F401
from smelt.runtime import combo_launcher, table_writer, triton_loading
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs

STEPS = 20


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("variants", nargs="?", default="copied,written")
    args = parser.parse_args(argv)
    counts = {"built": 0, "build_s": 0.0, "written": 0}
    build, write = combo_launcher.ComboLauncher._pointer_table, table_writer.TableWriter.write

    def counted_build(self, addresses, device):
        start = time.perf_counter()
        try:
            return build(self, addresses, device)
        finally:
            counts["built"] += 1
            counts["build_s"] += time.perf_counter() - start

    def counted_write(self, table, values):
        counts["written"] += 1
        return write(self, table, values)

    combo_launcher.ComboLauncher._pointer_table = counted_build
    table_writer.TableWriter.write = counted_write
    writer_for = triton_loading.writer_for
    for variant in args.variants.split(","):
        triton_loading.writer_for = writer_for if variant == "written" else (lambda *a: None)
        torch._dynamo.reset()
        step = case_callable(all_specs()[args.model], "train", "real", "cuda", 0, "smelt")
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        counts.update(built=0, build_s=0.0, written=0)
        before = torch.cuda.memory_stats().get("num_device_alloc", 0)
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / STEPS * 1e3
        mallocs = torch.cuda.memory_stats().get("num_device_alloc", 0) - before
        print(f"{args.model} tables {variant}: {wall:.2f} ms a step; per step {counts['built'] / STEPS:.1f} tables "
              f"built on the host ({counts['build_s'] / STEPS * 1e3:.2f} ms), {counts['written'] / STEPS:.1f} "
              f"writer launches; {mallocs} device mallocs in {STEPS} steps", flush=True)
        del step
    triton_loading.writer_for = writer_for


if __name__ == "__main__":
    main()
