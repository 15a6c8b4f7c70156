"""BERT's residual add + LayerNorm (bf16 rows of 768), smelt's generated kernel against Inductor's and
edited copies of smelt's (issue 22: BERT's 24 norms took 8.3 us each on the H200, Inductor's 6.1).

    python -m benchmarks.probes.norm_variants [--rows 4096] [--width 768]

The kernel is compiled by smelt (its source from SMELT_DEBUG_DIR), then launched as generated and as
edited: without the shift by the row's first value (one reduction fewer; the shift makes a row of
equal values exactly 0 in variance), as one reduction of Welford's combine (PERSISTENT_WELFORD), and at
other rows per program and warps. Each is checked against
eager before it is timed (do_bench, median)."""
from __future__ import annotations

import argparse
import glob
import os
import re
import tempfile

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import smelt
from smelt.codegen.triton import kernel as triton_kernel
from smelt.runtime.loader import load_module


def residual_norm(x, y, w, b):
    return F.layer_norm(x + y, (x.shape[-1],), w, b, 1e-12)


def _kernel_source(args, welford: str = "shifted") -> tuple[str, str]:
    folder = tempfile.mkdtemp()
    triton_kernel.PERSISTENT_WELFORD, default = welford, triton_kernel.PERSISTENT_WELFORD
    try:
        with smelt.config.override(debug_dir=folder, graph_cache=False):
            torch._dynamo.reset()
            torch.compile(residual_norm, backend="smelt")(*args)
    finally:
        triton_kernel.PERSISTENT_WELFORD = default
    (path,) = [p for p in glob.glob(f"{folder}/*/triton_per_*.py")]
    return os.path.basename(path)[:-3], open(path).read()


def _inductor_configs() -> list[str]:
    """The configs Inductor's autotuner settled on (it times a persistent reduction's few candidates at
    the first call)."""
    import gc
    found = []
    for obj in gc.get_objects():
        if type(obj).__name__ == "CachingAutotuner" and getattr(obj, "launchers", None):
            config = obj.launchers[0].config
            found.append(f"{obj.fn.__name__}: {config.kwargs} num_warps={config.num_warps} "
                         f"(of {len(obj.configs or ())} candidates left)")
    return found


def _variant(name: str, source: str, folder: str, label: str):
    path = os.path.join(folder, f"{name}_{label}.py")
    with open(path, "w") as f:
        f.write(source)
    return getattr(load_module(path, interpret=False), name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=768)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    n, c = args.rows, args.width
    x, y = (torch.randn(n, c, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = torch.randn(c, device="cuda", dtype=torch.bfloat16), torch.randn(c, device="cuda", dtype=torch.bfloat16)
    inputs = (x, y, w, b)
    want = residual_norm(*inputs)
    floor_bytes = 3 * n * c * 2
    rows = [("eager", do_bench(lambda: residual_norm(*inputs), return_mode="median"), 0.0)]
    torch._dynamo.reset()
    inductor = torch.compile(residual_norm)
    got = inductor(*inputs)
    rows.append(("inductor", do_bench(lambda: inductor(*inputs), return_mode="median"),
                 (got.float() - want.float()).abs().max().item()))
    for line in _inductor_configs():
        print(f"Inductor's kernel {line}")
    torch._dynamo.reset()
    compiled = torch.compile(residual_norm, backend="smelt")
    got = compiled(*inputs)
    rows.append(("smelt (whole call)", do_bench(lambda: compiled(*inputs), return_mode="median"),
                 (got.float() - want.float()).abs().max().item()))
    name, source = _kernel_source(inputs)
    header = re.search(r"XBLOCK=(\d+) RBLOCK=(\d+) num_warps=(\d+)", source)
    xblock, rblock, warps = (int(v) for v in header.groups())
    print(f"smelt's kernel {name}: XBLOCK={xblock} RBLOCK={rblock} num_warps={warps}")
    unshifted = "\n".join(
        re.sub(r"= tl\.reduce\(tl\.where\(rbase == 0.*$", "= tl.zeros([XBLOCK, 1], dtype=tl.float32)", line)
        for line in source.splitlines())
    folder = tempfile.mkdtemp()
    welford_name, welford_source = _kernel_source(inputs, "welford")
    kernels = {"as generated": _variant(name, source, folder, "generated"),
               "no shift": _variant(name, unshifted, folder, "unshifted"),
               "one Welford reduction": _variant(welford_name, welford_source, folder, "welford")}
    out = torch.empty_like(want)
    configs = sorted({(xblock, warps)} | {(xb, wp) for xb in (1, 2, 4, 8) for wp in (1, 2, 4, 8)})
    for label, kernel in kernels.items():
        for xb, wp in configs:

            def call(kernel=kernel, xb=xb, wp=wp):
                kernel[(triton.cdiv(n, xb),)](x, y, w, b, out, n, c, XBLOCK=xb, RBLOCK=rblock, num_warps=wp)
            out.fill_(float("nan"))
            try:
                call()
                error = (out.float() - want.float()).abs().max().item()
                ms = do_bench(call, return_mode="median")
            except Exception as e:  # noqa: BLE001 - too many registers, say
                print(f"  {label} XBLOCK={xb} warps={wp}: {type(e).__name__}: {str(e)[:80]}")
                continue
            rows.append((f"{label}, XBLOCK={xb} num_warps={wp}", ms, error))
    print(f"\n{n} x {c} bf16, floor {floor_bytes / 1e6:.1f} MB")
    print("| variant | us | GB/s | max abs error vs eager |\n| --- | --- | --- | --- |")
    for label, ms, error in rows:
        print(f"| {label} | {ms * 1e3:.2f} | {floor_bytes / (ms * 1e-3) / 1e9:.0f} | {error:.2e} |")


if __name__ == "__main__":
    main()
