"""A Halide pointwise kernel alone against ATen's (issue 23): smelt's compiled `a * b` kernel called
directly on preallocated tensors, against torch.mul(out=), at a few sizes, with torch's threads
(Halide's loops run on them: runtime/halide_threads.py). Medians of 300 calls, us.

    python -m benchmarks.probes.halide_pointwise [--elements-per-task N] [--omp-schedule "dynamic, 1"]

--elements-per-task sets codegen/halide/schedule.py's ELEMENTS_PER_TASK for the compile;
--omp-schedule rebuilds the OpenMP loop Halide's tasks run in with another `schedule(...)` clause
(the default is the one smelt ships): the figures behind both choices.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile

import torch

import smelt
from benchmarks.measure import median_call_ms
from smelt.codegen.halide import schedule
from smelt.runtime import halide_launcher, halide_threads


def _use_omp_schedule(clause: str) -> None:
    """Halide's parallel loops, from now on, in an OpenMP loop with `schedule(clause)`."""
    source = halide_threads.SOURCE.replace("schedule(static)", f"schedule({clause})")
    folder = tempfile.mkdtemp()
    c_file, library = os.path.join(folder, "par_for.c"), os.path.join(folder, "par_for.so")
    with open(c_file, "w") as f:
        f.write(source)
    subprocess.check_call(["cc", "-O2", "-fPIC", "-fopenmp", "-shared", "-o", library, c_file])
    shim = ctypes.CDLL(library)
    _use_omp_schedule.kept = shim  # loaded while the runtime may call it
    for runtime in halide_launcher._runtimes.values():
        runtime.halide_set_custom_do_par_for(ctypes.cast(shim.smelt_do_par_for, ctypes.c_void_p))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements-per-task", type=int)
    parser.add_argument("--omp-schedule")
    args = parser.parse_args(argv)
    if args.elements_per_task:
        schedule.ELEMENTS_PER_TASK = args.elements_per_task
    print(f"threads {torch.get_num_threads()}, ELEMENTS_PER_TASK {schedule.ELEMENTS_PER_TASK}, "
          f"OpenMP schedule {args.omp_schedule or 'as shipped'}")
    for numel in (16, 4096, 65536, 131072, 262144, 352256, 4 << 20):
        torch._dynamo.reset()
        smelt.observe.reset()
        a, b, out = torch.randn(numel), torch.randn(numel), torch.empty(numel)
        compiled = torch.compile(lambda a, b: a * b, backend="smelt", options={"graph_cache": False})
        compiled(a, b)
        if args.omp_schedule:
            _use_omp_schedule(args.omp_schedule)
        graph = smelt.observe.compiled_graphs()[-1]
        kernel = graph.call.__globals__[graph.kernel_names[0]]
        ours = median_call_ms(kernel, (a, b, out, numel), 300) * 1e3
        aten = median_call_ms(lambda: torch.mul(a, b, out=out), (), 300) * 1e3
        print(f"{numel:9d} elements: smelt's kernel alone {ours:8.1f} us, torch.mul(out=) {aten:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
