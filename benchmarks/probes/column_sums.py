"""Column sums as training's backward has them (a norm weight's gradient: rows of activations summed
into one value per feature), smelt's finisher variants against eager and Inductor, in one GPU call.

    python3 -m benchmarks.probes.column_sums [--rows 4096]

Qwen2's training profile (RESULTS ninth session) put smelt's norm-weight column sum at 31 us on the
H100 where Inductor's two kernels take 16.6 + 2.5. smelt splits the rows, and the split kernel's last
program reduces the [splits, columns] partials (a finisher, scheduler/finishers.py) one block after
another. The variants change how many blocks that is (`finisher_blocks.FINISH_TILE`), or send the
partials to a second kernel (`finish_limit` 1). Each compile runs with the graph cache off, so each
variant's code is its own.
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import triton
from triton.testing import do_bench

import smelt.config
from smelt.codegen.triton import finisher_blocks

WORKLOADS = {
    # name: (columns, function of (a, b, r): a and b [rows, columns], r [rows, 1])
    "rms_norm_weight": (1024, lambda a, b, r: (a * (b * r)).sum(0)),
    "layer_norm_weight_and_bias": (768, lambda a, b, r: ((a * b).sum(0), a.sum(0))),
    "global_sum": (1024, lambda a, b, r: a.sum()),
    # An MLP's bias gradient: [splits, 4096] partials pass the default limit, so a second kernel
    # takes them unless the limit is raised (the "limit 65536" variant).
    "mlp_bias": (4096, lambda a, b, r: (a * b).sum(0)),
}

VARIANTS = {
    "standalone blocks": {"tile": None},
    "tile 4096": {"tile": 4096},
    "tile 8192": {"tile": 8192},
    "tile 16384": {"tile": 16384},
    "second kernel": {"limit": 1},
    "limit 65536": {"limit": 65536},
}


@contextlib.contextmanager
def variant(tile="unset", limit=None):
    old_tile = finisher_blocks.FINISH_TILE
    if tile != "unset":
        finisher_blocks.FINISH_TILE = tile
    try:
        with smelt.config.override(graph_cache=False, **({} if limit is None else {"finish_limit": limit})):
            yield
    finally:
        finisher_blocks.FINISH_TILE = old_tile


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    for name, (columns, fn) in WORKLOADS.items():
        a, b = (torch.randn(args.rows, columns, device="cuda") for _ in range(2))
        r = torch.randn(args.rows, 1, device="cuda")
        want = fn(a, b, r)
        row = [f"eager {do_bench(lambda: fn(a, b, r), return_mode='median') * 1e3:.1f}"]
        torch._dynamo.reset()
        inductor = torch.compile(fn, backend="inductor")
        inductor(a, b, r)
        row.append(f"Inductor {do_bench(lambda: inductor(a, b, r), return_mode='median') * 1e3:.1f}")
        for label, setting in VARIANTS.items():
            torch._dynamo.reset()
            with variant(**setting):
                compiled = torch.compile(fn, backend="smelt")
                got = compiled(a, b, r)
            torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-3)
            row.append(f"{label} {do_bench(lambda: compiled(a, b, r), return_mode='median') * 1e3:.1f}")
        print(f"{name} [{args.rows}, {columns}] us: " + ", ".join(row))


if __name__ == "__main__":
    main()
