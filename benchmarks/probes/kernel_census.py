"""Kernels, ATen calls and planned peak bytes, summed over every graph of model-suite cases (tiny, CPU):
run at two commits to see which real programs a scheduling or lowering change touches.

    python -m benchmarks.probes.kernel_census bert:train densenet:infer_bf16 --json /tmp/census.json
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import tempfile


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="model:mode")
    parser.add_argument("--json", help="also write every case's kernel names here")
    args = parser.parse_args(argv)
    os.environ.setdefault("SMELT_GRAPH_CACHE", "0")
    import torch

    import smelt  # noqa: F401
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    found = {}
    for case in args.cases:
        model, mode = case.split(":")
        folder = tempfile.mkdtemp(prefix="smelt-census-")
        os.environ["SMELT_DEBUG_DIR"] = folder
        torch._dynamo.reset()
        case_callable(all_specs()[model], mode, "tiny", "cpu", 0, "smelt")()
        names, calls, peak = [], 0, 0
        for wrapper in sorted(glob.glob(f"{folder}/*/wrapper.py")):
            source = open(wrapper).read()
            planned = re.search(r"PLANNED_PEAK_BYTES = (\d+)", source)
            peak += int(planned.group(1)) if planned else 0
            names += sorted(re.findall(r"^# ((?:halide|triton)_\w+):", source, re.M))
            calls += len(re.findall(r"as_planned\(", source))
        found[case] = {"kernels": len(names), "aten_calls": calls, "planned_peak": peak, "names": names}
        print(f"{case}: {len(names)} kernels, {calls} ATen calls, planned peaks {peak} bytes", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f)


if __name__ == "__main__":
    main()
