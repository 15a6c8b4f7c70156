"""Row kernels that store per element (softmax, norms, their backwards) at other warps than the heuristic's:
the elements a warp holds (codegen/triton/kernel.py ELEMENTS_PER_WARP) swept over the synthetic suite's rows
and transformer shapes (issue 22: BERT's residual add + LayerNorm ran 13% faster at 1024 a warp than at 512).

    python -m benchmarks.probes.row_warps [--values 512,1024,2048,512w] [--rounds 3] [--only NAME,...]
        [--constant ROW_ELEMENTS_PER_WARP]

--constant names the constant of codegen/triton/kernel.py the values set (ELEMENTS_PER_WARP, every
reduction outside the tuned branches, by default).

A value with a "w" after it also takes a norm's mean and variance in one Welford reduction
(codegen/triton/kernel.py PERSISTENT_WELFORD) rather than three.

Each case is compiled once per value (graph cache off), checked against eager, then timed interleaved
(do_bench medians, the median over rounds)."""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import smelt
from smelt.codegen.triton import kernel as triton_kernel


def residual_layer_norm(x, y, w, b):
    return F.layer_norm(x + y, (x.shape[-1],), w, b, 1e-12)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def add_rms_norm(x, y, w):
    s = x + y
    return s, (s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def softmax(x):
    return torch.softmax(x, -1)


def layer_norm_training(x, w, b):
    out = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.autograd.grad(out.float().square().sum(), (x, w, b))


def _case(fn, rows, width, dtype, affine=0, second=False, grad=False):
    def build():
        x = torch.randn(rows, width, device="cuda", dtype=dtype, requires_grad=grad)
        args = [x]
        if second:
            args.append(torch.randn(rows, width, device="cuda", dtype=dtype))
        for _ in range(affine):
            args.append(torch.randn(width, device="cuda", dtype=dtype, requires_grad=grad))
        return args
    return fn, build


CASES = {
    # the synthetic suite's rows (benchmarks/workloads.py)
    "add_rms_norm 16384x4096 bf16": _case(add_rms_norm, 16384, 4096, torch.bfloat16, 1, second=True),
    "layer_norm 16384x4096 fp32": _case(layer_norm, 16384, 4096, torch.float32, 2),
    "softmax 32768x2048 fp32": _case(softmax, 32768, 2048, torch.float32),
    # transformer shapes
    "residual+LN 4096x768 bf16 (BERT)": _case(residual_layer_norm, 4096, 768, torch.bfloat16, 2, second=True),
    "LN 8192x1024 bf16": _case(layer_norm, 8192, 1024, torch.bfloat16, 2),
    "LN 16384x512 fp32": _case(layer_norm, 16384, 512, torch.float32, 2),
    "LN 8192x1536 bf16": _case(layer_norm, 8192, 1536, torch.bfloat16, 2),
    "add_rms_norm 8192x2048 bf16": _case(add_rms_norm, 8192, 2048, torch.bfloat16, 1, second=True),
    "softmax 49152x512 bf16": _case(softmax, 49152, 512, torch.bfloat16),
    "softmax 65536x256 fp32": _case(softmax, 65536, 256, torch.float32),
    "softmax 8192x4096 bf16": _case(softmax, 8192, 4096, torch.bfloat16),
    "LN fwd+bwd 4096x768 bf16": _case(layer_norm_training, 4096, 768, torch.bfloat16, 2, grad=True),
    "LN fwd+bwd 8192x2048 bf16": _case(layer_norm_training, 8192, 2048, torch.bfloat16, 2, grad=True),
}


def _compiled(fn, args, value: str, constant: str = "ELEMENTS_PER_WARP"):
    """`value` is elements a warp, with a "w" after it for one Welford reduction per norm
    (PERSISTENT_WELFORD)."""
    setattr(triton_kernel, constant, int(value.rstrip("w")))
    triton_kernel.PERSISTENT_WELFORD = "welford" if value.endswith("w") else "shifted"
    torch._dynamo.reset()
    with smelt.config.override(graph_cache=False):
        compiled = torch.compile(fn, backend="smelt")
        compiled(*args)  # compiles under this value; later calls reuse the code
    return compiled


def _check(got, want, dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), **tol)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", default="512,1024,2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated case-name prefixes")
    parser.add_argument("--constant", default="ELEMENTS_PER_WARP")
    args = parser.parse_args(argv)
    values = args.values.split(",")
    default = str(getattr(triton_kernel, args.constant))
    default_welford = triton_kernel.PERSISTENT_WELFORD
    print(f"{torch.cuda.get_device_name()}, {args.constant}: heuristic's value {default}")
    print("| case | " + " | ".join(f"{v} us" for v in values) + " | " +
          " | ".join(f"speed at {v}" for v in values if v != default) + " |")
    print("| --- |" + " --- |" * (2 * len(values) - 1))
    for name, (fn, build) in CASES.items():
        if args.only and not any(name.startswith(p) for p in args.only.split(",")):
            continue
        torch.manual_seed(0)
        inputs = build()
        want = fn(*inputs)
        callables = {}
        for value in values:
            try:
                callables[value] = _compiled(fn, inputs, value, args.constant)
                _check(callables[value](*inputs), want, inputs[0].dtype)
            except Exception as e:  # noqa: BLE001 - a value that fails is a finding, printed
                print(f"  {name} at {value}: {type(e).__name__}: {str(e)[:200]}")
        times = {v: [] for v in callables}
        for _ in range(args.rounds):
            for value, compiled in callables.items():
                times[value].append(do_bench(lambda: compiled(*inputs), return_mode="median"))
        us = {v: statistics.median(t) * 1e3 for v, t in times.items()}
        cells = [f"{us[v]:.2f}" if v in us else "-" for v in values]
        ratios = [f"{us[default] / us[v]:.3f}x" if v in us and default in us else "-" for v in values if v != default]
        print(f"| {name} | " + " | ".join(cells + ratios) + " |", flush=True)
    setattr(triton_kernel, args.constant, int(default))
    triton_kernel.PERSISTENT_WELFORD = default_welford


if __name__ == "__main__":
    main()
