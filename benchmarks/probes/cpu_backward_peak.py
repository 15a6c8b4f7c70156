"""Where a training step's backward peaks on the CPU, for smelt or Inductor (issue 22: peak memory):
the forward and backward of one warmed step run under one profiler (it reports a block's free only
if it saw the block allocated), and at the backward's highest point the probe prints the bytes alive
that the forward made, those the backward made, and the backward's largest live blocks with the op
that allocated each (its two innermost profiler frames) and the allocation's number in the backward.

    python -m benchmarks.probes.cpu_backward_peak efficientnet --backend smelt [--batch 4] [--seq 128] [--no-autocast]
"""
from __future__ import annotations

import argparse
import functools

import torch

MARKER = 123457  # bytes: an allocation of this size marks where the backward begins


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", default="smelt")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=None, help="a language model's length (default: the suite's)")
    parser.add_argument("--no-autocast", action="store_true")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from .cpu_peak_memory import allocation_events

    import smelt  # noqa: F401
    from smelt.tools.model_suite import zoo_text, zoo_vision
    from smelt.tools.model_suite.spec import seeded
    from smelt.tools.model_suite.timing import build_model
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[args.model]
    zoo_text.BATCH["real"] = zoo_vision.BATCH["real"] = args.batch
    if args.seq:
        zoo_text.SEQ["real"] = args.seq
    model = build_model(spec, "real", 0).train()
    sample = spec.sample("real", generator=seeded(0))
    loss_fn = torch.compile(functools.partial(spec.loss, model), backend=args.backend)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_autocast):
            return loss_fn(sample)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        forward().backward()
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = forward()
        torch.empty(MARKER, dtype=torch.uint8)
        loss.backward()
    events = []
    for at, size, ptr, node in allocation_events(prof):
        frames, parent = [], node.parent
        while parent is not None and len(frames) < 2:
            frames.append(parent.name)
            parent = parent.parent
        events.append((at, size, ptr, " / ".join(frames)))
    begin = next(k for k, event in enumerate(events) if event[1] == MARKER)
    live: dict[int, tuple[int, str, int]] = {}
    current = 0
    for k, (_, size, ptr, site) in enumerate(events):
        current += size
        if size > 0:
            live[ptr] = (size, site, k - begin)
        else:
            live.pop(ptr, None)
        if k == begin:
            start = peak = current
            at_peak, peak_at = dict(live), 0
        elif k > begin and current > peak:
            peak, at_peak, peak_at = current, dict(live), k - begin
    mib = 2 ** 20
    forward_made = sum(size for size, _, k in at_peak.values() if k <= 0)
    backward_made = sorted((v for v in at_peak.values() if v[2] > 0), key=lambda v: -v[0])
    print(f"{args.model} {args.backend}: the backward peaks {(peak - start) / mib:.1f} MiB over its start, at its "
          f"allocation {peak_at} of {len(events) - begin - 1}; alive there: made by the forward "
          f"{forward_made / mib:.1f} MiB, by the backward {sum(v[0] for v in backward_made) / mib:.1f} MiB")
    for size, site, k in backward_made[:args.top]:
        print(f"  {size / mib:8.2f} MiB  allocation {k}  {site}")


if __name__ == "__main__":
    main()
