"""How long a model-suite case's layout plan takes (pipeline's `plan` stage: channels-last operands,
padded products, and the fake-tensor re-trace of what they change), at the suite's real size on the
CPU, without running the model: the compile stops after the first graph's plan.

    SMELT_MATMUL_PADDING=on python -m benchmarks.probes.layout_plan_time bert:infer_bf16 [--whole] [--profile]

--whole re-traces every node, as the plan did before it re-traced only what its changes reach.

SMELT_MATMUL_PADDING=on plans as for the GPU (the CPU's Target pads nothing); SMELT_CHANNELS_LAST=on
likewise for convolution nets.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time


class _Planned(Exception):
    pass


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="MODEL:MODE of smelt.tools.model_suite")
    parser.add_argument("--whole", action="store_true", help="re-trace every node (the earlier behaviour)")
    parser.add_argument("--profile", action="store_true", help="also the plan's cProfile, by cumulative time")
    args = parser.parse_args(argv)
    from smelt.tools.model_suite import torchvision_stub
    torchvision_stub.install_if_missing()
    from smelt import pipeline
    from smelt.lowering import fx_retrace
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs

    profile = cProfile.Profile()
    retraced = []
    plan, retrace = pipeline.plan_layouts, fx_retrace.Checkpoint.changed

    def counted(self, gm):
        dirty = set(gm.graph.nodes) if args.whole else retrace(self, gm)
        retraced.append(len(dirty))
        return dirty

    def timed_plan(gm, *rest):
        start = time.perf_counter()
        profile.enable()
        try:
            return plan(gm, *rest)
        finally:
            profile.disable()
            nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            print(f"plan_layouts {time.perf_counter() - start:.3f} s over {nodes} nodes; "
                  f"nodes changed before each re-trace: {retraced}")

    def stop(*a, **k):
        raise _Planned

    pipeline.plan_layouts, pipeline.generate_graph = timed_plan, stop
    fx_retrace.Checkpoint.changed = counted
    model, mode = args.case.split(":")
    fn = case_callable(all_specs()[model], mode, "real", "cpu", 0, "smelt")
    try:
        fn()
    except Exception as e:  # Dynamo wraps the backend's exception
        if not any(isinstance(x, _Planned) for x in (e, e.__cause__, e.__context__)):
            raise
    if args.profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
