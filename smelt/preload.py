"""Modules that the first compile of a process imports anyway, imported with smelt instead.

Each is imported lazily by torch, Triton or sympy the first time a compile reaches a certain
point; imported here, they leave the first compile and join `import smelt`, where the rest of
torch's and Triton's import cost already is. An import that fails (a build without
torch.distributed, say) is skipped: the compile then does without it as before.
"""
from __future__ import annotations

import atexit
import gc
import importlib

from .config import setting

MODULES = (
    # sympy's Add imports its tensor algebra the first time it adds terms (smelt's index math).
    "sympy.tensor.tensor",
    # Triton's argument specialization imports Gluon at the first kernel launch.
    "triton.experimental.gluon",
    # Dynamo imports DTensor's context-parallel hooks the first time it traces a torch function.
    "torch.distributed.tensor.experimental",
    # What Dynamo's first trace and output graph import (found as the modules new in sys.modules
    # after a first compile that read everything else from smelt's graph cache).
    "torch._dynamo.dce_extra_outputs", "torch._subclasses.schema_check_mode", "torch.fx.experimental.validator",
    "torch._export.db.logging", "torch._export.passes._node_metadata_hook",
    "torch._export.passes.add_runtime_assertions_for_constraints_pass", "torch._export.passes.collect_tracepoints_pass",
    "torch.export._trace", "torch.export._unlift", "torch.export._leakage_detection_utils",
    "torch._higher_order_ops.passes.inline_invoke_subgraph",
    # ... and what AOTAutograd imports when the graph is not cached. (torch 2.13's Dynamo also
    # imports all of its own backend modules after each compile, about 0.5 s on a 2-core CPU, most
    # of it Inductor's CUDA-graph support: left to Dynamo, since smelt does not import Inductor.)
    "torch._functorch._aot_autograd.subclass_codegen",
    "torch._functorch._activation_checkpointing.remat_using_tags_for_fwd_loss_bwd_graph_pass",
    "triton.tools.tensor_descriptor",
)


def import_lazy_dependencies() -> None:
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part of a library may be missing or broken
            pass


def skip_guard_latency_profile() -> None:
    """Dynamo times each new frame's guards once after building them, for a metric only it reads,
    and flushes the CPU caches first so the timing is cold: 20-25 ms of a 70 ms warm first call on
    the 2-core CPU. smelt skips that timing (reported as 0 µs); SMELT_GUARD_PROFILE=1 keeps it."""
    if setting("SMELT_GUARD_PROFILE"):
        return
    try:
        from torch._dynamo import guards
    except Exception:  # noqa: BLE001 - a torch without Dynamo has nothing to skip
        return
    if callable(getattr(guards, "profile_guard_manager", None)):
        guards.profile_guard_manager = _no_guard_profile


def _no_guard_profile(root, scope, n_iters) -> float:
    return 0.0


def freeze_import_time_objects() -> None:
    """Move every object alive now (torch, Triton and sympy's modules: millions of them) into the
    collector's permanent generation. They live as long as the process anyway, but each full
    collection during a compile rescans them: Dynamo's first trace of a layer norm took 0.24 s
    instead of 0.07 s on the 2-core CPU. Frozen objects are still freed by reference counting;
    only cycles among them are never collected. SMELT_GC_FREEZE=0 leaves the collector alone."""
    if setting("SMELT_GC_FREEZE"):
        gc.freeze()
        # Thawed at exit, so the last collection still reaches them (nanobind, which Triton's
        # bindings use, reports objects left uncollected at shutdown as leaks).
        atexit.register(gc.unfreeze)
