"""Kernels compiled several at a time, in worker processes (SMELT_COMPILE_WORKERS).

A cold compile is mostly the kernels' own compiles, one after another: Halide compiling and linking
each CPU kernel (70-80% of ResNet-18's on 2 cores), Triton compiling each GPU kernel (11 of BERT's
19 s on the H100, 41 kernels). Before a graph's kernels are loaded, the backend's `build_ahead`
hands those not in the cache to worker processes (compile_worker.py), which compile them into the
cache folder as the main process would; the main process then loads them from there. A worker's
failure is only logged at debug: the main process compiles that kernel again, where its error is
raised with the kernel's context.

Processes, not threads: Halide's compiler writes its messages to fd 1, which halide_compile
redirects process-wide, and Triton's compile holds the GIL for most of its time. A worker imports
no torch, so it starts in about 0.1 s (0.4 s more for Triton); workers stay up for the process's
later graphs and end with it. `start` launches them ahead of need, already importing a backend's
compiler, while Dynamo and AOTAutograd trace. `submit` returns without waiting: a training graph's
forward kernels compile while the main process lowers its backward (pipeline.py).
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
        self.unread = 0  # replies to jobs sent without waiting (warm-ups), read before the next reply
        self.lock = threading.Lock()  # one job at a time: batches submitted together share the workers

    def send(self, job: dict) -> None:
        """Sends a job whose reply is not awaited (a warm-up)."""
        with self.lock:
            self._send(job)

    def _send(self, job: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            self.unread += 1
        except (BrokenPipeError, OSError, ValueError):  # ValueError: its pipe closed at exit
            pass

    def compile(self, job: dict) -> dict:
        with self.lock:
            return self._compile(job)

    def _compile(self, job: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            while self.unread:
                self.process.stdout.readline()
                self.unread -= 1
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError, ValueError) as e:  # ValueError: its pipe closed at exit
            return {"name": job["name"], "ok": False, "error": f"worker gone: {e}"}
        if not line:  # the worker died (a crash inside Halide's or Triton's compiler)
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
_warmed: dict[int, set] = {}  # id(worker) -> the backends it was sent a warm-up for


def _pool(count: int) -> list[_Worker]:
    """`count` live workers, those not busy with another batch's job first."""
    with _lock:
        _workers[:] = [w for w in _workers if w.alive]
        while len(_workers) < count:
            _workers.append(_Worker())
        return sorted(_workers, key=lambda w: w.lock.locked())[:count]


def start(count: int, backend: str) -> None:
    """Starts `count` workers (where fewer run) and has each import `backend`'s compiler now,
    without waiting: a later `run_jobs` finds them ready."""
    if count < 2:
        return
    for worker in _pool(count):
        done = _warmed.setdefault(id(worker), set())
        if backend not in done:
            worker.send({"backend": backend, "warm": True, "name": "warm-up"})
            done.add(backend)


_closing = threading.Event()  # set at exit: batches nobody waited for take no more jobs


@atexit.register
def _close_all() -> None:
    _closing.set()
    for worker in _workers:
        worker.close()
    _workers.clear()


class Batch:
    """Jobs handed to the workers; `wait` returns their replies once every one is in. `after`:
    earlier batches building jobs this one left out (the same binary asked for twice), which
    `wait` and `done` wait for too; their replies stay theirs."""

    def __init__(self, threads: list[threading.Thread], replies: list[dict], after: tuple = ()):
        self.threads = threads
        self.replies = replies
        self.after = tuple(after)
        self.waited = False

    def wait(self) -> list[dict]:
        for batch in self.after:
            batch.wait()
        for t in self.threads:
            t.join()
        if not self.waited:
            self.waited = True
            for reply in self.replies:
                if not reply["ok"]:
                    log.debug("smelt: kernel %s did not compile in a worker (%s)", reply["name"], reply.get("error"))
        return self.replies

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads) and all(b.done for b in self.after)


def submit(jobs: list[dict], workers: int, after: tuple = ()) -> Batch:
    """Starts the jobs (each names its "backend" and "name"; compile_worker.py reads the rest)
    `workers` at a time and returns at once; the Batch's `wait` gives the replies, each
    {"name", "ok", "error"?, "seconds"}, once `after`'s batches are done too."""
    pending: queue.Queue = queue.Queue()
    # Longest first, so that the last job to finish is a short one (a 5x5 depthwise window's kernel
    # builds 5-10x longer than a pointwise one for sm_90; in program order the long ones came last).
    for job in sorted(jobs, key=_source_length, reverse=True):
        pending.put(job)
    replies: list[dict] = []

    def drain(worker: _Worker) -> None:
        while not _closing.is_set():
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            replies.append(worker.compile(job))

    # Daemon threads: a batch nobody waits for (a forward whose backward never ran) does not hold the
    # process's exit, where _close_all ends the workers.
    threads = [threading.Thread(target=drain, args=(w,), name="smelt-compile", daemon=True)
               for w in (_pool(min(workers, len(jobs))) if jobs else [])]
    for t in threads:
        t.start()
    return Batch(threads, replies, after)


def _source_length(job: dict) -> int:
    """A job's expected compile time, as the length of its source (the kernel's, or its module's)."""
    if "source" in job:
        return len(job["source"])
    try:
        return os.path.getsize(job["path"])
    except (KeyError, OSError):
        return 0


def run_jobs(jobs: list[dict], workers: int) -> list[dict]:
    """`submit`, then wait for the replies."""
    return submit(jobs, workers).wait()


def compile_ahead(kernels: list[tuple[str, str, str | None]], cache_dir: str, workers: int) -> int:
    """Compiles the (name, source, source path) Halide kernels not yet built, `workers` at a time;
    returns how many it built. With fewer than two to build, or one worker, it leaves them to the caller."""
    from .halide_compile import is_built, runtime_library
    missing = [k for k in kernels if not is_built(k[0], k[1], cache_dir)]
    if workers < 2 or len(missing) < 2:
        return 0
    runtime_library(cache_dir)  # once, here, before the workers link against it
    jobs = [{"backend": "halide", "name": name, "source": source, "cache_dir": cache_dir, "path": path}
            for name, source, path in missing]
    return sum(r["ok"] for r in run_jobs(jobs, workers))
