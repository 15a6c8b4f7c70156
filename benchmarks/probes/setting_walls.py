"""A smelt setting's effect on a real model's wall time (issue 22), read against the GPU host's drift:
smelt compiled once per setting (as torch.compile options, so each is its own cache entry) and,
with --inductor, Inductor, all alive in one process and timed in interleaved turns (the model
suite's timing._rounds: each figure the best of its turns, each turn a do_bench median).

    python -m benchmarks.probes.setting_walls efficientnet resnet50 \\
        --settings default pointwise_convolutions=on --inductor [--turns 9]

A setting is one of smelt's Config field=value pairs, several joined by commas; `default` is none.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch

from benchmarks.probes.gpu_model_profile import parse_setting
from smelt.tools.model_suite import timing
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--mode", default="infer_bf16")
    parser.add_argument("--settings", nargs="+", default=["default"])
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--turns", type=int, default=9)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = "real" if device == "cuda" else "tiny"
    timing.ROUNDS = args.turns
    folders = tempfile.TemporaryDirectory(prefix="smelt-walls-")
    with timing._recompiles_counted():  # each setting is another entry of the model's code objects
        for model in args.models:
            measure(model, args, device, size, folders.name)


def measure(model, args, device, size, folder) -> None:
    """One model's settings (and Inductor) compiled, then timed in turns."""
    spec = all_specs()[model]
    torch._dynamo.reset()
    calls = {}
    for i, setting in enumerate(args.settings):
        options = {"graph_cache": True, "cache_dir": os.path.join(folder, f"{model}-{i}"),
                   **parse_setting(setting)}
        calls[f"smelt {setting}"] = case_callable(spec, args.mode, size, device, 0, "smelt", options=options)
    if args.inductor:
        calls["inductor"] = case_callable(spec, args.mode, size, device, 0, "inductor")
    for fn in calls.values():  # compiled before any turn, each as it would be alone
        timing._fresh_code_state()
        fn()
        fn()
    result = {"ms": {}}
    timing._rounds(calls, device, 15, result)
    first = next(iter(calls))
    for name, ms in result["ms"].items():
        turns = result["ms_turns"][name]
        ratio = result["ms"][first] / ms
        print(f"{model} {args.mode} {name}: best {ms:.3f} ms, median {statistics.median(turns):.3f} (turns "
              f"{' '.join(f'{t:.2f}' for t in turns)}); {first} / this {ratio:.3f}x", flush=True)
    calls.clear()


if __name__ == "__main__":
    main()
