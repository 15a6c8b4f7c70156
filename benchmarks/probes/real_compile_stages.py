"""A model-suite case's first and second calls in this process and smelt's compile stages
(smelt/compile_stages.py), at the suite's real sizes: where a long cold compile goes.

    python -m benchmarks.probes.real_compile_stages [smelt|eager|inductor] [--model deberta_v2]
        [--mode infer_fp32] [--device cpu] [--size tiny]

--size tiny builds the suite's tiny configs (SMELT_CPU_BACKEND=triton with SMELT_CACHE_DIR set to a new
folder: the GPU's kernels and schedule, as RESULTS' CPU schedule-stage figures were taken).
"""
import argparse
import time

import smelt  # noqa: F401
from smelt import compile_stages
from smelt.tools.model_suite.timing import case_callable
from smelt.tools.model_suite.zoo import all_specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", nargs="?", default="smelt")
    parser.add_argument("--model", default="deberta_v2")
    parser.add_argument("--mode", default="infer_fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    parser.add_argument("--compile-only", action="store_true",
                        help="stop at the first kernel launch (a real size's first call through Triton's interpreter "
                             "takes minutes): the first graph's stages, without `load`'s kernel runs")
    args = parser.parse_args()
    from smelt.tools.model_suite import torchvision_stub  # timm's models without torchvision (the CPU's venv)
    torchvision_stub.install_if_missing()
    fn = case_callable(all_specs()[args.model], args.mode, args.size, args.device, 0, args.backend)
    if args.compile_only:
        stop_at_first_launch()
    start = time.perf_counter()
    try:
        fn()
    except Exception as e:  # Dynamo wraps what the launch raised
        if not (args.compile_only and stopped_at_first_launch(e)):
            raise
        stages = {k: round(v, 2) for k, v in compile_stages.totals.items()}
        print(f"{args.backend}: until the first kernel launch {time.perf_counter() - start:.1f} s; stages {stages}")
        return
    first = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    second = time.perf_counter() - start
    stages = {k: round(v, 2) for k, v in compile_stages.totals.items()}
    print(f"{args.backend}: first call {first:.1f} s, second {second:.2f} s; stages {stages}")


class _Compiled(Exception):
    pass


def stopped_at_first_launch(e: BaseException) -> bool:
    """Whether `e` (as Dynamo wraps what a launch raised) is `stop_at_first_launch`'s stop."""
    return any(isinstance(x, _Compiled) for x in (e, e.__cause__, e.__context__))


def stop_at_first_launch() -> None:
    from smelt.runtime import launcher

    def stop(*args, **kwargs):
        raise _Compiled
    launcher.TritonLauncher.__call__ = stop


if __name__ == "__main__":
    main()
