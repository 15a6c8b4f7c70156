"""The index simplifications a real compile asks for, timed alone (issue 24: DenseNet's schedule stage
spent seconds in `symbolic._simplify_index`): a model-suite case is compiled up to its first kernel
launch (as `real_compile_stages --compile-only`), each distinct (index, ranges) question is kept, and
the distinct questions are answered again with an empty memo, best of three passes. Run at two commits
to compare.

    SMELT_CPU_BACKEND=triton SMELT_CHANNELS_LAST=on SMELT_MATMUL_PADDING=on \\
        python -m benchmarks.probes.index_simplify --model densenet --mode train
"""
import argparse
import os
import tempfile
import time

import smelt.symbolic as symbolic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="densenet")
    parser.add_argument("--mode", default="train")
    parser.add_argument("--size", default="real", choices=("tiny", "real"))
    args = parser.parse_args()
    os.environ.setdefault("SMELT_CACHE_DIR", tempfile.mkdtemp(prefix="smelt-index-simplify-"))
    os.environ["SMELT_GRAPH_CACHE"] = "0"
    questions = {}
    answer = symbolic._simplify_index

    def kept(expr, items):
        questions.setdefault((expr, items), None)
        return answer(expr, items)
    symbolic._simplify_index = kept
    try:
        _compile(args)
    finally:
        symbolic._simplify_index = answer
    print(f"{args.model} {args.mode}: {len(questions)} distinct index simplifications")
    best = float("inf")
    for _ in range(3):
        answer.cache_clear()
        start = time.perf_counter()
        for expr, items in questions:
            answer(expr, items)
        best = min(best, time.perf_counter() - start)
    print(f"answered again with an empty memo: {best:.2f} s, {1000 * best / max(len(questions), 1):.2f} ms each")


def _compile(args) -> None:
    from benchmarks.probes import real_compile_stages
    from smelt.tools.model_suite import torchvision_stub
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    torchvision_stub.install_if_missing()
    fn = case_callable(all_specs()[args.model], args.mode, args.size, "cpu", 0, "smelt")
    real_compile_stages.stop_at_first_launch()
    try:
        fn()
    except Exception as e:
        if not real_compile_stages.stopped_at_first_launch(e):
            raise


if __name__ == "__main__":
    main()
