"""Which graphs of the model suite a warm start can skip (issue 24): each case compiled once on the
CPU into a new cache folder, with the graph cache's reasons counted: ATen graphs stored or not (and
why), Dynamo graphs stored (AOTAutograd skipped on a warm start) or not (and why).

    python -m benchmarks.probes.graph_cache_coverage [--models a,b] [--modes infer_fp32,train,dynamic]
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import re
import tempfile


class _Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.counts = collections.Counter()

    def emit(self, record):
        text = record.getMessage()
        match = re.search(r"smelt: (\w+) graph not cached: (.*)", text) or re.search(
            r"smelt: (Dynamo) graph not cached: (.*)", text)
        if match:
            reason = re.sub(r"\b\d+\b", "N", match.group(2))[:90]
            self.counts[f"{match.group(1)}: {reason}"] += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="")
    parser.add_argument("--modes", default="infer_fp32,train,dynamic")
    args = parser.parse_args()
    os.environ["SMELT_CACHE_DIR"] = tempfile.mkdtemp(prefix="smelt-cache-coverage-")
    import torch
    from smelt import graph_cache
    from smelt.tools.model_suite.modes import applies
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    reasons = _Reasons()
    logging.getLogger("smelt.graph_cache").addHandler(reasons)
    logging.getLogger("smelt.graph_cache").setLevel(logging.DEBUG)
    specs = all_specs()
    names = args.models.split(",") if args.models else list(specs)
    for name in names:
        for mode in args.modes.split(","):
            if not applies(specs[name], mode):
                continue
            before, reasons.counts = graph_cache.stats.copy(), collections.Counter()
            torch._dynamo.reset()
            try:
                case_callable(specs[name], mode, "tiny", "cpu", 0, "smelt")()
            except Exception as e:  # noqa: BLE001  (a probe: say what failed and go on)
                print(f"{name} {mode}: failed ({type(e).__name__}: {str(e)[:100]})")
                continue
            made = graph_cache.stats - before
            print(f"{name} {mode}: ATen graphs {made['aten_miss'] + made['aten_uncacheable']} "
                  f"({made['aten_uncacheable']} uncacheable); Dynamo graphs stored {made['dynamo_stored']}"
                  + "".join(f"\n    {k}: {v}" for k, v in reasons.counts.items()),
                  flush=True)


if __name__ == "__main__":
    main()
