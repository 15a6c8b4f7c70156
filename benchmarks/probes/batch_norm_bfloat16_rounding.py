"""A bfloat16 batch norm in training on the CPU, eager against smelt, each against float64 (fuzz seeds
4330 and 1960, tests/fuzz_open_findings.md):

1. the saved mean and rstd (bfloat16, as the running statistics): how many channels are not float64's
   value rounded once;
2. the x / weight / bias gradients over shapes and layouts: smelt's rmse over eager's;
3. the weight gradient when the output is also normalized over a dim of size 1 (exact gradient 0 there):
   rmse over draws of inputs and cotangents, and in how many draws the normalize's gradient alone is
   eager's to the bit.

    python -m benchmarks.probes.batch_norm_bfloat16_rounding [--statistics-draws 200] [--draws 300]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import smelt  # noqa: F401 - registers the backend

aten = torch.ops.aten


def _rmse(got, exact) -> float:
    return (got.double() - exact).pow(2).mean().sqrt().item()


def saved_statistics(draws: int) -> None:
    def stats(x, w, b, rm, rv):
        return aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)[1:3]
    compiled = torch.compile(stats, backend="smelt")
    gen = torch.Generator().manual_seed(0)
    missed = {(name, stat): 0 for name in ("eager", "smelt") for stat in ("mean", "rstd")}
    for draw in range(draws):
        x = (torch.randn(2, 16, 9, generator=gen) * (draw % 5 + 1) + draw % 3).bfloat16()
        w, b = (torch.randn(16, generator=gen).bfloat16() for _ in range(2))
        args = (x, w, b, torch.zeros(16).bfloat16(), torch.ones(16).bfloat16())
        var, mean = torch.var_mean(x.double(), (0, 2), correction=0)
        exact = (mean.bfloat16(), torch.rsqrt(var + 1e-5).bfloat16())
        for name, f in (("eager", stats), ("smelt", compiled)):
            for stat, got, want in zip(("mean", "rstd"), f(*args), exact):
                missed[name, stat] += int((got != want).sum())
    cells = ", ".join(f"{name}'s {stat} {n}" for (name, stat), n in missed.items())
    print(f"1. saved statistics not correctly rounded, of {16 * draws} channels: {cells}")


def _gradients(f, args, cotangent, wanted=(0, 3, 4)):
    leaves = [a.detach().clone().requires_grad_(k in wanted) for k, a in enumerate(args)]
    outputs = f(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    cotangents = cotangent if isinstance(cotangent, (list, tuple)) else [cotangent]
    torch.autograd.backward(list(outputs), [c.to(o.dtype) for o, c in zip(outputs, cotangents)])
    return [leaves[k].grad for k in wanted]


def gradients_over_shapes() -> None:
    def fn(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2) * 1.5
    ratios = []
    for seed in range(40):
        torch.manual_seed(seed)
        shape = [(2, 3, 4, 5), (8, 4, 3, 3), (1, 5, 7), (16, 3), (3, 8, 2, 2)][seed % 5]
        x = (torch.randn(shape) * (seed % 4 + 1) + seed % 3).bfloat16()
        if seed % 3 == 0 and len(shape) == 4:
            x = x.to(memory_format=torch.channels_last)
        c = shape[1]
        args = [x, torch.randn(c).bfloat16(), torch.rand(c).bfloat16() + 0.5, torch.randn(c).bfloat16(),
                torch.randn(c).bfloat16()]
        cotangent = torch.randn(shape).bfloat16()
        exact = _gradients(fn, [a.double() for a in args], cotangent)
        eager = _gradients(fn, args, cotangent)
        torch._dynamo.reset()
        smelt_grads = _gradients(torch.compile(fn, backend="smelt"), args, cotangent)
        ratios += [_rmse(s, e) / max(_rmse(g, e), 1e-12) for s, g, e in zip(smelt_grads, eager, exact)]
    print(f"2. gradients over 40 shapes: smelt's rmse / eager's median {statistics.median(ratios):.2f}, "
          f"largest {max(ratios):.2f}")


def normalized_over_one(draws: int) -> None:
    def fn(x, rm, rv, w, b):
        v = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)
        return v, F.normalize(v, dim=0)
    compiled = torch.compile(fn, backend="smelt")
    errors = {"eager": [], "smelt": []}
    normalize = lambda v: F.normalize(v, dim=0)  # noqa: E731
    normalize_compiled = torch.compile(normalize, backend="smelt")
    same = 0
    for seed in range(draws):
        gen = torch.Generator().manual_seed(seed)
        args = [torch.randn(1, 4, 4, generator=gen), torch.randn(4, generator=gen),
                torch.rand(4, generator=gen) + 0.5, torch.randn(4, generator=gen), torch.randn(4, generator=gen)]
        args = [a.bfloat16() for a in args]
        cotangents = [torch.randn(1, 4, 4, generator=gen, dtype=torch.float64) for _ in range(2)]
        exact = _gradients(fn, [a.double() for a in args], cotangents, (0, 3))[1]
        for name, f in (("eager", fn), ("smelt", compiled)):
            errors[name].append(_rmse(_gradients(f, args, cotangents, (0, 3))[1], exact))
        v = fn(*args)[0].detach()
        g = cotangents[1].bfloat16()
        same += torch.equal(_gradients(normalize, [v], g, (0,))[0], _gradients(normalize_compiled, [v], g, (0,))[0])
    cells = ", ".join(f"{name} median {statistics.median(v):.4f} mean {statistics.mean(v):.4f}" for name, v in errors.items())
    print(f"3. weight gradient beside a normalize over a dim of size 1, {draws} draws: {cells}; "
          f"the normalize's gradient alone equal to eager's in {same}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statistics-draws", type=int, default=200)
    parser.add_argument("--draws", type=int, default=300)
    args = parser.parse_args(argv)
    saved_statistics(args.statistics_draws)
    gradients_over_shapes()
    normalized_over_one(args.draws)


if __name__ == "__main__":
    main()
