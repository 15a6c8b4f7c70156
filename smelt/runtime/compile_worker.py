"""A worker process of compile_pool.py: compiles Halide kernels into the cache folder, one per line
of JSON read from stdin, answering each with a line of JSON on stdout.

Run as a script (`python compile_worker.py`), it imports smelt's runtime modules without smelt's
package `__init__` (which imports torch and Dynamo: 3.4 s against 0.05 s on the 2-core CPU), so a
worker is ready in about 0.1 s.
"""
import json
import os
import sys
import time
import types


def _runtime_without_torch():
    package = types.ModuleType("smelt")
    package.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    sys.modules.setdefault("smelt", package)
    from smelt.runtime import halide_compile
    return halide_compile


def main() -> None:
    halide_compile = _runtime_without_torch()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not break the protocol
    for line in sys.stdin:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            halide_compile.kernel_library(job["name"], job["source"], job["cache_dir"], job.get("path"))
            reply = {"name": job["name"], "ok": True}
        except Exception as e:  # the main process compiles it again and raises it with context
            reply = {"name": job["name"], "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        reply["seconds"] = time.perf_counter() - start
        reply["torch_loaded"] = "torch" in sys.modules  # for the test that it starts light
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
