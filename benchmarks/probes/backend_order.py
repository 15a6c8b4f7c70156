"""Does a backend timed after another in one process run slower? (issue 22: the suite's training rows
are host-bound and their wall moved with the order the backends ran in.) Each named backend in turn:
Dynamo reset, a fresh model-suite case, three warm calls, do_bench's median, and the time Python's
garbage collector took meanwhile.

    python -m benchmarks.probes.backend_order bert smelt,inductor,smelt,inductor [--mode train]
"""
from __future__ import annotations

import argparse
import gc
import time

import torch
import triton.testing

import smelt  # noqa: F401
from benchmarks.measure import median_call_ms
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("backends", help="comma-separated, repeats allowed")
    parser.add_argument("--mode", default="train")
    args = parser.parse_args(argv)
    spent = {"s": 0.0, "full": 0, "start": 0.0}

    def on_gc(phase, info):
        if phase == "start":
            spent["start"] = time.perf_counter()
        else:
            spent["s"] += time.perf_counter() - spent["start"]
            spent["full"] += info["generation"] == 2
    gc.callbacks.append(on_gc)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        fn = case_callable(all_specs()[args.model], args.mode, "real" if device == "cuda" else "tiny", device, 0,
                           backend)
        for _ in range(3):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        spent.update(s=0.0, full=0)
        ms = triton.testing.do_bench(fn, return_mode="median") if device == "cuda" else median_call_ms(fn, (), 15, warmup=0)
        print(f"{backend}: {ms:.2f} ms median; garbage collector {spent['s'] * 1e3:.1f} ms, "
              f"{spent['full']} full collections", flush=True)
        del fn



if __name__ == "__main__":
    main()
