"""What a compiled training forward saves for its backward, by shape and dtype, under each backend
(issue 22: training peaks): the tensors AOTAutograd's compiled functions behind one loss saved.

    python -m benchmarks.probes.saved_tensors resnet50 [--size tiny] [--backends smelt,inductor] [--top 25]
    python -m benchmarks.probes.saved_tensors efficientnet --autocast   # the CPU's bfloat16 autocast,
        # standing in for the suite's AMP training on CUDA (its op lists differ a little from CUDA's)
    python -m benchmarks.probes.saved_tensors efficientnet --size real --device cuda --autocast --diff
    python -m benchmarks.probes.saved_tensors efficientnet --diff       # only what one side saves more of
"""
from __future__ import annotations

import argparse
import collections
import functools

import torch

import smelt  # noqa: F401
from smelt.tools.model_suite.spec import build_model, seeded
from smelt.tools.model_suite.zoo import all_specs
from smelt.tools.saved import saved_for_backward


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", default="tiny", choices=("tiny", "real"))
    parser.add_argument("--backends", default="smelt,inductor")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--autocast", action="store_true", help="run the forward under bfloat16 autocast")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--diff", action="store_true", help="list only (shape, dtype) counts the backends differ in")
    args = parser.parse_args(argv)
    spec = all_specs()[args.model]
    by_backend = {}
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        model = build_model(spec, args.size, 0).to(args.device).train()
        autocast = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.autocast)
        with autocast:
            loss = torch.compile(functools.partial(spec.loss, model), backend=backend)(
                spec.sample(args.size, generator=seeded(0)).to(args.device))
        tensors = saved_for_backward(loss)
        saved = [(tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes()) for t in tensors]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        print(f"{backend}: {len(saved)} saved in {len(storages)} storages, {sum(storages.values()) / 2 ** 20:.1f} MiB "
              "(rows below: each tensor's whole storage)")
        by_backend[backend] = collections.Counter(saved)
        if not args.diff:
            _print(by_backend[backend], args.top)
    if args.diff and len(by_backend) == 2:
        first, second = by_backend.values()
        for name, more in zip(by_backend, (first - second, second - first)):
            print(f"{name} saves besides:")
            _print(more, args.top)


def _print(counts, top: int) -> None:
    for (shape, dtype, size), n in sorted(counts.items(), key=lambda kv: -kv[0][2] * kv[1])[:top]:
        print(f"   {n:3d} x {shape} {dtype} {size / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
    main()
