"""What a compiled training forward saves for its backward, by shape and dtype, under each backend
(issue 22: training peaks): the tensors AOTAutograd's compiled functions behind one loss saved.

    python -m benchmarks.probes.saved_tensors resnet50 [--size tiny] [--backends smelt,inductor] [--top 25]
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
    args = parser.parse_args(argv)
    spec = all_specs()[args.model]
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        model = build_model(spec, args.size, 0).train()
        loss = torch.compile(functools.partial(spec.loss, model), backend=backend)(
            spec.sample(args.size, generator=seeded(0)))
        saved = [(tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
                 for t in saved_for_backward(loss)]
        print(f"{backend}: {len(saved)} saved, {sum(b for *_, b in saved) / 2 ** 20:.1f} MiB")
        counts = collections.Counter(saved)
        for (shape, dtype, size), n in sorted(counts.items(), key=lambda kv: -kv[0][2] * kv[1])[:args.top]:
            print(f"   {n:3d} x {shape} {dtype} {size / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
    main()
