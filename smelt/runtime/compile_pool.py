"""CPU kernels compiled several at a time, in worker processes (SMELT_COMPILE_WORKERS).

A cold compile on the CPU is mostly Halide compiling and linking each kernel (70-80% of ResNet-18's
on 2 cores, one kernel after another). Before a graph's kernels are loaded, those not in the cache
are compiled by worker processes (compile_worker.py), each into the cache folder as the main process
would; the main process then loads them from there. A worker's failure is only logged at debug: the
main process compiles that kernel again, where its error is raised with the kernel's context.

Processes, not threads: Halide's compiler writes its messages to fd 1, which halide_compile
redirects process-wide. A worker imports no torch, so it starts in about 0.1 s; workers stay up for
the process's later graphs and end with it.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading

log = logging.getLogger("smelt.runtime")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")


class _Worker:
    def __init__(self):
        self.process = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)

    def compile(self, job: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError) as e:
            return {"name": job["name"], "ok": False, "error": f"worker gone: {e}"}
        if not line:  # the worker died (a crash inside Halide's compiler)
            return {"name": job["name"], "ok": False, "error": f"worker exited with {self.process.wait()}"}
        return json.loads(line)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


_workers: list[_Worker] = []
_lock = threading.Lock()


def _pool(count: int) -> list[_Worker]:
    with _lock:
        _workers[:] = [w for w in _workers if w.alive]
        while len(_workers) < count:
            _workers.append(_Worker())
        return _workers[:count]


@atexit.register
def _close_all() -> None:
    for worker in _workers:
        worker.close()
    _workers.clear()


def compile_ahead(kernels: list[tuple[str, str, str | None]], cache_dir: str, workers: int) -> int:
    """Compiles the (name, source, source path) kernels not yet built, `workers` at a time; returns
    how many it built. With fewer than two to build, or one worker, it leaves them to the caller."""
    from .halide_compile import is_built, runtime_library
    missing = [k for k in kernels if not is_built(k[0], k[1], cache_dir)]
    if workers < 2 or len(missing) < 2:
        return 0
    runtime_library(cache_dir)  # once, here, before the workers link against it
    jobs: queue.Queue = queue.Queue()
    for name, source, path in missing:
        jobs.put({"name": name, "source": source, "cache_dir": cache_dir, "path": path})
    replies: list[dict] = []

    def drain(worker: _Worker) -> None:
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            replies.append(worker.compile(job))

    threads = [threading.Thread(target=drain, args=(w,), name="smelt-compile") for w in _pool(min(workers, len(missing)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for reply in replies:
        if not reply["ok"]:
            log.debug("smelt: kernel %s did not compile in a worker (%s)", reply["name"], reply.get("error"))
    return sum(r["ok"] for r in replies)
