"""What a training step's forward saves for the backward, smelt against Inductor (issue 22: peak memory).

For each backend: the forward graph's saved outputs as the partitioner left them (shape, dtype, the ops that
made each, in order), and at run time the bytes the saved tensors hold, each storage counted once (views of
one buffer share it). The two lists are printed side by side where they differ.

    python -m benchmarks.probes.saved_activations qwen2 [--device cuda] [--batch 2 --seq 128]

On the CPU the model runs under bfloat16 autocast, as the suite's CUDA training does.
"""
from __future__ import annotations

import argparse
import collections
import difflib
import functools
import re

import torch


def _chain(node, depth: int = 3) -> str:
    ops = []
    while isinstance(node, torch.fx.Node) and len(ops) <= depth:
        ops.append(getattr(node.target, "__name__", str(node.target)).split(".")[0])
        node = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    return " <- ".join(ops)


def saved_outputs(gm: torch.fx.GraphModule, first_saved: int) -> list[str]:
    """One line per saved tensor of a forward graph: shape, dtype and the ops that made it."""
    lines = []
    for value in gm.graph.find_nodes(op="output")[0].args[0][first_saved:]:
        meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if isinstance(meta, torch.Tensor):
            lines.append(f"{tuple(meta.shape)} {str(meta.dtype).removeprefix('torch.')} {_chain(value)}")
    return lines


def _capture(backend: str, store: list) -> None:
    """Patches the backend's forward compiler to record the saved outputs of each forward graph."""
    from smelt.saved_inputs import saved_outputs_start

    def record(gm):
        store.extend(saved_outputs(gm, saved_outputs_start()))
    if backend == "smelt":
        import smelt.backend
        original = smelt.backend._Compiler.__call__

        def call(self, gm, example_inputs):
            if self.kind == "forward":
                record(gm)
            return original(self, gm, example_inputs)
        smelt.backend._Compiler.__call__ = call
    else:
        import torch._inductor.compile_fx as compile_fx
        import torch._inductor.config
        torch._inductor.config.force_disable_caches = True  # a cache hit would skip the forward's compile
        original_forward = compile_fx.compile_fx_forward

        def forward(gm, *args, **kwargs):
            record(gm)
            return original_forward(gm, *args, **kwargs)
        compile_fx.compile_fx_forward = forward


def measure(name: str, backend: str, device: str, batch, seq) -> tuple[list[str], int, int]:
    from smelt.tools.model_suite import zoo_text
    from smelt.tools.model_suite.spec import seeded
    from smelt.tools.model_suite.timing import build_model
    from smelt.tools.model_suite.zoo import all_specs
    spec = all_specs()[name]
    if batch is not None:
        zoo_text.BATCH["real"] = batch
    if seq is not None:
        zoo_text.SEQ["real"] = seq
    torch._dynamo.reset()
    lines: list[str] = []
    _capture(backend, lines)
    model = build_model(spec, "real", 0).to(device).train()
    sample = spec.sample("real", generator=seeded(0)).to(device)
    loss_fn = torch.compile(functools.partial(spec.loss, model), backend=backend)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    with autocast:
        loss_fn(sample).backward()
    storages: dict[int, int] = {}
    viewers: dict[int, list] = collections.defaultdict(list)
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        viewers[storage.data_ptr()].append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        loss = loss_fn(sample)
    loss.backward()
    # Storages by the tensors saved from them: where two lists differ in bytes, not only in names.
    by_kind = collections.Counter()
    for ptr, size in storages.items():
        by_kind[" + ".join(sorted(viewers[ptr]))] += size
    return lines, count, sum(storages.values()), by_kind


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=None, help="default: 2 on the CPU, the suite's on CUDA")
    parser.add_argument("--seq", type=int, default=None, help="default: 128 on the CPU, the suite's on CUDA")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        args.batch, args.seq = args.batch or 2, args.seq or 128
    import os
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    import smelt  # noqa: F401
    found, kinds = {}, {}
    for backend in ("smelt", "inductor"):
        lines, count, held, by_kind = measure(args.model, backend, args.device, args.batch, args.seq)
        found[backend] = lines
        kinds[backend] = by_kind
        print(f"{args.model} {backend}: {len(lines)} saved outputs in the graph, {count} saved tensors at run "
              f"time holding {held / 2 ** 20:.1f} MiB (each storage once)", flush=True)
    print("run-time storages, MiB by the tensors saved from them, where the two differ:")
    for kind in sorted(set(kinds["smelt"]) | set(kinds["inductor"])):
        a, b = kinds["smelt"].get(kind, 0), kinds["inductor"].get(kind, 0)
        if a != b:
            print(f"  smelt {a / 2 ** 20:8.2f}  inductor {b / 2 ** 20:8.2f}  {kind}")
    # Names differ between the two graphs (numbering, _to_copy / convert_element_type): compared by pattern.
    def normal(line):
        return re.sub(r"convert_element_type|_to_copy", "cast", re.sub(r"embedding|index", "lookup", line))
    a = collections.Counter(normal(x) for x in found["smelt"])
    b = collections.Counter(normal(x) for x in found["inductor"])
    for line in difflib.unified_diff(sorted((a - b).elements()), sorted((b - a).elements()),
                                     "smelt only", "inductor only", lineterm="", n=0):
        print(line)


if __name__ == "__main__":
    main()
