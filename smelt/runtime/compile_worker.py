"""A worker process of compile_pool.py: compiles kernels into the cache folder, one job per line of
JSON read from stdin, answering each with a line of JSON on stdout.

A job names its backend: "halide" (a CPU kernel's library, as halide_compile.kernel_library builds
it), "triton" (a GPU kernel's cubin for one argument description, kept where
kernel_binaries.KernelVariants looks for it) or "triton_jit" (one of smelt's hand-written kernels
that Triton's JIT launches, compiled into Triton's own cache for the specialization jit_ahead.py
got from the JIT). A job with "warm" only imports that backend's compiler.

Run as a script (`python compile_worker.py`), it imports smelt's runtime modules without smelt's
package `__init__` (which imports torch and Dynamo: 3.4 s against 0.05 s on the 2-core CPU), so a
worker is ready in about 0.1 s.
"""
import importlib.util
import json
import os
import sys
import time
import types


def _runtime_without_torch():
    package = types.ModuleType("smelt")
    package.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    sys.modules.setdefault("smelt", package)


def _warm_triton() -> None:
    import triton.compiler  # noqa: F401
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return
    triton_key()  # Triton's hash of its own installation, which its first compile would compute


def _kernel_function(path: str, name: str):
    """The @triton.jit function `name` of the generated source at `path`, compiled for the GPU
    whatever TRITON_INTERPRET says (a CPU run checking CUDA compiles sets it)."""
    import triton
    triton.knobs.runtime.interpret = False
    spec = importlib.util.spec_from_file_location("smelt_worker_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _triton(job: dict) -> None:
    from smelt.runtime import triton_cubin
    if job.get("warm"):
        return _warm_triton()
    fn = _kernel_function(job["path"], job["name"])
    fields = triton_cubin.compile_cubin(fn, job["spec"], job["constexprs"], job["num_warps"], job["capability"],
                                        job["options"], job.get("cache_dir"))
    triton_cubin.write_kept(job["folder"], fields)


def _triton_jit(job: dict) -> None:
    """Compiles as Triton's JIT would at the kernel's first launch, so that its cache has it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    from smelt.runtime.jit_ahead import as_tuples
    fn = _kernel_function(job["path"], job["name"])
    source = ASTSource(fn, job["signature"], constexprs={tuple(k): v for k, v in job["constants"]},
                       attrs={tuple(k): v for k, v in job["attrs"]})
    capability = job["capability"]
    options = {k: as_tuples(v) for k, v in job["options"].items()}
    triton.compile(source, target=GPUTarget("cuda", capability[0] * 10 + capability[1], 32), options=options)


def _halide(job: dict) -> None:
    from smelt.runtime import halide_compile
    if job.get("warm"):
        return
    halide_compile.kernel_library(job["name"], job["source"], job["cache_dir"], job.get("path"))


def main() -> None:
    _runtime_without_torch()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not break the protocol
    for line in sys.stdin:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            {"triton": _triton, "triton_jit": _triton_jit}.get(job.get("backend"), _halide)(job)
            reply = {"name": job["name"], "ok": True}
        except Exception as e:  # the main process compiles it again and raises it with context
            reply = {"name": job["name"], "ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        reply["seconds"] = time.perf_counter() - start
        reply["torch_loaded"] = "torch" in sys.modules  # for the test that it starts light
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
