"""smelt::onednn_linear: a float32 product `bias + mat1 @ mat2` on the CPU through oneDNN's linear
(mkldnn._linear_pointwise over mat2's transpose, a Linear's [N, K] weight as it lies), where timing both
on this machine found it faster than ATen's mm / addmm.

ATen's float32 products go to MKL's sgemm. On the 2-core AMD EPYC (Zen 5) of the sixtieth session that ran
at about 210 GFLOP/s, and oneDNN's linear over the same operands 1.8-2.2x faster from 512 rows, level at
64 and slower on a few short rows (1 x 256 x 256: 26.4 us through this op against ATen's 6.8;
`benchmarks/probes/onednn_products.py`).
Which library wins depends on the CPU and the shape, so `faster_in_onednn` times both once per shape,
thread count and machine, and keeps the answer in the cache folder for later compiles.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .checked_files import atomic_write

log = logging.getLogger("smelt")

# Timing the choice: up to this many interleaved rounds of one call each, after a call of each to
# warm up, fewer where a round would pass TIMING_BUDGET_S (a large product's times vary little).
ROUNDS = 5
TIMING_BUDGET_S = 0.1
# oneDNN is taken when its median is at most this share of ATen's: ties keep ATen's call.
MARGIN = 0.9

# Fewer multiply-adds than this stay in ATen untimed: oneDNN was slower on the probe's smaller shapes
# (8 x 256 x 256: 0.47x ATen's speed) and level at this size (64 x 256 x 256), and timing such a
# product in a busy process picks by noise.
MIN_MACS = 64 * 256 * 256

_chosen: dict[tuple, bool] = {}


@torch.library.custom_op("smelt::onednn_linear", mutates_args=())
def onednn_linear(bias: Optional[torch.Tensor], mat1: torch.Tensor, mat2: torch.Tensor,
                  activation: str = "none") -> torch.Tensor:
    """addmm(bias, mat1, mat2), or mm without a bias; `activation` "relu" or "gelu" (erf's form)
    applied by oneDNN's post-op, as _addmm_activation on the CPU applies it (lowering/gemm_epilogue.py)."""
    return torch.ops.mkldnn._linear_pointwise(mat1, mat2.t(), bias, activation, [],
                                              "none" if activation == "gelu" else "")


@onednn_linear.register_fake
def _(bias, mat1, mat2, activation="none"):
    return mat1.new_empty((mat1.shape[0], mat2.shape[1]))


def available() -> bool:
    """Whether this torch has oneDNN's linear (a CPU build with MKLDNN)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def faster_in_onednn(rows: int, inner: int, columns: int, biased: bool, cache_dir: str | None) -> bool:
    """Whether oneDNN's linear ran a float32 [rows, inner] x [inner, columns] product (plus a bias)
    faster than ATen's on this machine, at this process's thread count: timed on random operands the
    first time, then read from this process or the cache folder."""
    if rows * inner * columns < MIN_MACS:
        return False
    threads = torch.get_num_threads()
    key = (rows, inner, columns, biased, threads)
    if key in _chosen:
        return _chosen[key]
    path = _path(key, cache_dir) if cache_dir else None
    chosen = _read(path) if path else None
    if chosen is None:
        try:
            aten_ms, onednn_ms = _time(rows, inner, columns, biased)
        except RuntimeError as e:  # a shape oneDNN makes no primitive for: ATen's call, in this process
            log.debug("smelt: float32 product %dx%dx%d stays in ATen: oneDNN failed (%s)", rows, inner, columns, e)
            _chosen[key] = False
            return False
        chosen = onednn_ms <= MARGIN * aten_ms
        log.debug("smelt: float32 product %dx%dx%d%s on %d threads: ATen %.3f ms, oneDNN %.3f ms: %s", rows, inner,
                  columns, " + bias" if biased else "", threads, aten_ms, onednn_ms, "oneDNN" if chosen else "ATen")
        if path:
            try:
                atomic_write(path, json.dumps({"onednn": chosen, "aten_ms": aten_ms, "onednn_ms": onednn_ms}).encode())
            except OSError as e:  # the choice still holds in this process
                log.warning("smelt: could not keep the product choice %s (%s)", path, e)
    _chosen[key] = chosen
    return chosen


def _time(rows: int, inner: int, columns: int, biased: bool) -> tuple[float, float]:
    """Median milliseconds of ATen's and oneDNN's product, timed in alternation."""
    with unset_fake_temporarily(), torch.no_grad():  # lowering runs under AOTAutograd's fake mode
        gen = torch.Generator().manual_seed(0)
        mat1 = torch.randn(rows, inner, generator=gen)
        weight = torch.randn(columns, inner, generator=gen)
        bias = torch.randn(columns, generator=gen) if biased else None
        calls = (lambda: torch.mm(mat1, weight.t()) if bias is None else torch.addmm(bias, mat1, weight.t()),
                 lambda: onednn_linear(bias, mat1, weight.t()))
        times = ([], [])
        start = time.perf_counter()
        for call in calls:
            call()
        rounds = max(1, min(ROUNDS, int(TIMING_BUDGET_S / max(time.perf_counter() - start, 1e-9))))
        for _ in range(rounds):
            for call, kept in zip(calls, times):
                start = time.perf_counter()
                call()
                kept.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def _path(key: tuple, cache_dir: str) -> str:
    machine = f"{platform.machine()}|{_cpu_name()}|{torch.__version__}"
    digest = hashlib.sha256(f"onednn_linear|{machine}|{key}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir, "autotune", f"{digest}.json")


def _read(path: str) -> bool | None:
    try:
        with open(path) as f:
            return bool(json.load(f)["onednn"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.info("smelt: ignoring unreadable product choice %s: %s", path, e)
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
