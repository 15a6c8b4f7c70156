"""A context in which smelt's Triton kernels get other blocks than its heuristic picks: the probes
that sweep block shapes (short_rows, channel_means) compile under it."""
from __future__ import annotations

import contextlib
import dataclasses

import smelt.config
from smelt.codegen.triton import backend as triton_backend


@contextlib.contextmanager
def blocks_where(select, change: dict | None):
    """Every kernel whose heuristic config `select(config)` accepts gets `change` (XBLOCK, RBLOCK,
    num_warps; None: none), compiled with the graph cache off so that each variant's code is its own."""
    real = triton_backend.choose_blocks

    def chosen(plan, interpret, limit):
        config = real(plan, interpret, limit)
        if change is None or not plan.is_reduction or config.row_split > 1 or not select(config):
            return config
        return dataclasses.replace(config, **change)
    triton_backend.choose_blocks = chosen
    try:
        with smelt.config.override(graph_cache=False):
            yield
    finally:
        triton_backend.choose_blocks = real


def us(fn, args) -> float:
    """do_bench's median of fn(*args), in microseconds; on CPU tensors the median of 50 timed calls."""
    import statistics
    import time
    if not any(getattr(a, "is_cuda", False) for a in args):
        fn(*args)
        times = []
        for _ in range(50):
            start = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    from triton.testing import do_bench
    return do_bench(lambda: fn(*args), return_mode="median") * 1e3


def eager_and_inductor_us(fn, args) -> dict:
    """fn's time in eager and compiled by Inductor (after a call that compiles it)."""
    import torch
    times = {"eager": us(fn, args)}
    torch._dynamo.reset()
    inductor = torch.compile(fn, backend="inductor")
    inductor(*args)
    times["Inductor"] = us(inductor, args)
    return times
