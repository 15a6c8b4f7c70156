"""smelt's hand-written Triton kernels (biased_head.py's and the like, launched by Triton's own JIT at
run time) compiled ahead in the compile workers, while the graph is still being lowered.

Triton's JIT compiles such a kernel at its first launch, in the main process, during the graph's
first call: BERT's head took 0.47-0.69 s of a 4.7 s cold first call on the H100
(`benchmarks/probes/main_process_compiles.py`). Here, when a graph is planned, each op holding such a
kernel (registered with `register`) names the launches its node's shapes will make; Triton's JIT is
asked for each launch's specialization without compiling it (its `jit_cache_hook`, which Triton
calls with the signature, constants, attributes and options before every compile it would do), and
a worker compiles that specialization into Triton's cache folder. The first launch then finds it
there. A worker that computed another key than the JIT's would cost only the compile it saved:
the JIT compiles on a miss, as it always did.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from typing import Any, Callable

log = logging.getLogger("smelt.runtime")


@dataclasses.dataclass
class Launch:
    """One launch of a @triton.jit function as its op will make it: `args` may hold stand-ins for
    tensors (`Stand`), which carry only what Triton specializes on."""
    fn: Any  # a triton JITFunction
    args: tuple
    kwargs: dict


class Stand:
    """A tensor as Triton's specialization sees it: a dtype and a 16-byte aligned address (a
    TensorDescriptor's base, or a pointer argument), nothing allocated."""

    def __init__(self, dtype):
        self.dtype = dtype

    @staticmethod
    def data_ptr() -> int:
        return 0


# op overload -> planner(*the node's argument values, fake tensors for tensors) -> [Launch]
_PLANNERS: dict[Any, Callable[..., list]] = {}
_pending: dict[str, object] = {}  # kernel name -> the compile_pool.Batch compiling it
_pending_lock = threading.Lock()


def register(op, planner: Callable[..., list]) -> None:
    _PLANNERS[op] = planner


def submit_for_graph(gm, workers: int) -> int:
    """Hands the workers the JIT kernels `gm`'s registered ops will launch on CUDA; returns how many."""
    if workers < 2 or not _PLANNERS:
        return 0
    jobs = {}
    for node in gm.graph.nodes:
        planner = _PLANNERS.get(node.target)
        if planner is None:
            continue
        values = [a.meta.get("val") if hasattr(a, "meta") else a for a in node.args]
        try:
            launches = planner(*values)
        except Exception as e:  # a launch not planned is compiled at its first call, as before
            log.debug("smelt: no ahead compile for %s: %s", node.format_node(), e)
            continue
        for launch in launches:
            job = _job(launch)
            if job is not None:
                jobs[json.dumps(job, sort_keys=True)] = job
    if not jobs:
        return 0
    from .compile_pool import submit
    batch = submit(list(jobs.values()), workers)
    with _pending_lock:
        for job in jobs.values():
            _pending[job["name"]] = batch
    return len(jobs)


def wait_for(fn) -> None:
    """Before `fn`'s launch: waits for a worker still compiling it (else its JIT would compile it too)."""
    if _pending:
        with _pending_lock:
            batch = _pending.pop(fn.__name__, None)
        if batch is not None:
            batch.wait()


def _job(launch: Launch) -> dict | None:
    spec = specialization(launch)
    if spec is None:
        return None
    import torch
    capability = torch.cuda.get_device_capability()
    return {"backend": "triton_jit", "name": launch.fn.__name__, "path": os.path.abspath(launch.fn.fn.__code__.co_filename),
            "signature": spec["signature"], "constants": [[list(k), v] for k, v in spec["constants"].items()],
            "attrs": [[list(k), v] for k, v in spec["attrs"].items()], "options": spec["options"],
            "capability": list(capability)}


def specialization(launch: Launch) -> dict | None:
    """The JIT's signature, constants, attributes and options for `launch`, got from its cache hook
    without compiling; None where the JIT has it compiled already in this process, or a constant is
    not a plain value."""
    import triton
    captured = {}

    def hook(**kw):
        captured.update(kw["compile"])
        return True  # skip the compile

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    runtime.jit_cache_hook = hook
    try:
        launch.fn.warmup(*launch.args, grid=(1,), **launch.kwargs)
    finally:
        runtime.jit_cache_hook = previous
    if not captured:
        return None
    constants = captured["constants"]
    if not all(isinstance(v, (bool, int, float, str)) or v is None for v in constants.values()):
        return None
    options = json.loads(captured["specialization_data"])["options"]
    return {"signature": dict(captured["signature"]), "constants": dict(constants),
            "attrs": dict(captured["configs"][0]), "options": options}


def as_tuples(value):
    """JSON's lists back into the tuples Triton's options held (their hash reads their text)."""
    if isinstance(value, list):
        return tuple(as_tuples(v) for v in value)
    return value
