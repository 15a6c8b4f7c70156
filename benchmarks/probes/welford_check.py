"""A LayerNorm's forward and backward compiled under both forms of PERSISTENT_WELFORD
(codegen/triton/kernel.py): each gradient's distance from eager's and both errors against float64.
Run on the H100 (RESULTS, fifty-third session): the two forms' errors equal eager's.

    python -m benchmarks.probes.welford_check [--rows 4096] [--width 768]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import smelt
from smelt.codegen.triton import kernel as triton_kernel


def _gradients(x, w, b):
    out = F.layer_norm(x, x.shape[-1:], w, b)
    return torch.autograd.grad(out.float().square().sum(), (x, w, b))


def _rmse(a, b) -> float:
    return (a.double() - b).pow(2).mean().sqrt().item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=768)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    inputs = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for shape in ((args.rows, args.width), (args.width,), (args.width,))]
    reference = _gradients(*(t.detach().double().requires_grad_() for t in inputs))
    eager = _gradients(*inputs)
    default = triton_kernel.PERSISTENT_WELFORD
    for form in ("shifted", "welford"):
        triton_kernel.PERSISTENT_WELFORD = form
        torch._dynamo.reset()
        with smelt.config.override(graph_cache=False):
            got = torch.compile(_gradients, backend="smelt")(*inputs)
        for name, g, e, r in zip(("x", "w", "b"), got, eager, reference):
            print(f"{form} grad {name}: max |smelt - eager| {(g.float() - e.float()).abs().max().item():.3g}, "
                  f"rmse against float64 smelt {_rmse(g, r):.6g}, eager {_rmse(e, r):.6g}")
    triton_kernel.PERSISTENT_WELFORD = default


if __name__ == "__main__":
    main()
