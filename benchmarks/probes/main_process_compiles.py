"""The Triton kernels a model-suite case's cold first call compiles in the main process (not in smelt's
compile workers), and the seconds each took (issue 24): a fresh process with brand-new cache folders,
`triton.compiler.compile` wrapped before anything is compiled.

    python -m benchmarks.probes.main_process_compiles bert infer_bf16 [--workers 16]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("mode")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp()
    os.environ.update(SMELT_CACHE_DIR=folder, TORCHINDUCTOR_CACHE_DIR=os.path.join(folder, "ind"),
                      TRITON_CACHE_DIR=os.path.join(folder, "triton"), SMELT_COMPILE_WORKERS=str(args.workers))
    import torch
    import triton.compiler
    compiled = []
    compile_fn = triton.compiler.compile

    def timed(src, *a, **k):
        start = time.perf_counter()
        try:
            return compile_fn(src, *a, **k)
        finally:
            name = getattr(getattr(src, "fn", None), "__name__", str(src)[:60])
            compiled.append((name, time.perf_counter() - start))
    # The JIT binds triton.compiler.compile when a kernel's first launch sets up its device caches.
    triton.compiler.compile = timed
    import smelt  # noqa: F401
    from smelt.tools.model_suite.timing import case_callable
    from smelt.tools.model_suite.zoo import all_specs
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fn = case_callable(all_specs()[args.model], args.mode, "real" if device == "cuda" else "tiny", device, 0, "smelt")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    print(f"first call {time.perf_counter() - start:.2f} s; Triton compiles in the main process: {len(compiled)}")
    for name, seconds in compiled:
        print(f"  {name}: {seconds:.2f} s")


if __name__ == "__main__":
    main()
