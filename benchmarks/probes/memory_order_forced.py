"""The model suite or the fuzzer with scheduler/memory_order.py's threshold at 1 byte, so that tiny
graphs are reordered too (correctness of the reorder's dependencies on many graphs), and a count of
the graphs it reordered.

    python -m benchmarks.probes.memory_order_forced suite --modes train,infer_fp32
    python -m benchmarks.probes.memory_order_forced fuzz --count 100 --seed 2104 --in-process --backward
"""
from __future__ import annotations

import atexit
import sys

import smelt.pipeline
import smelt.scheduler.memory_order as memory_order


def main() -> None:
    memory_order.MIN_FREED_BYTES = 1
    counts = {"graphs": 0, "reordered": 0}
    order = memory_order.order_for_memory

    def counted(steps, outputs, graph):
        result = order(steps, outputs, graph)
        counts["graphs"] += 1
        counts["reordered"] += result is not steps
        return result
    smelt.pipeline.order_for_memory = counted
    atexit.register(lambda: print(f"memory_order: {counts['reordered']} of {counts['graphs']} graphs reordered",
                                  file=sys.stderr))
    tool, args = sys.argv[1], sys.argv[2:]
    if tool == "suite":
        from smelt.tools.model_suite.__main__ import main as suite
        sys.argv = ["model_suite", *args]
        suite()
    elif tool == "fuzz":
        from smelt.tools.fuzz.cli import main as fuzz
        sys.exit(fuzz(args))
    else:
        raise SystemExit(f"unknown tool {tool!r}: suite or fuzz")


if __name__ == "__main__":
    main()
