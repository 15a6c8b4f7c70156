"""Picks a kernel's block configuration by timing the candidates on the first launch.

The winner is stored on disk under the cache dir, keyed by the kernel's source, the device and
the launch's sizes, so another process launching the same kernel reads it and times nothing.
Only kernels whose launches are idempotent are tuned (every output fully rewritten, nothing
accumulated in place): the candidates run many times on the real arguments.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time

import torch

from ..artifact import TileBlocks
from .checked_files import atomic_write

log = logging.getLogger("smelt")

# How candidates are timed, in the disk cache's key: choices made by an older way are not read back
# (do_bench's picks of small kernels were noise).
TIMING = "queued-1"


class Autotuner:
    def __init__(self, source: str, configs: list, cache_dir: str, name: str = ""):
        self.name = name  # the kernel's, for the log
        self.configs = configs
        self.digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        self.folder = os.path.join(cache_dir, "autotune")
        self.chosen: dict[tuple, object] = {}

    def known(self, sizes: tuple, device) -> object | None:
        """The config already chosen for these sizes, in this process or on disk; None if untimed."""
        if sizes not in self.chosen:
            config = self._read(self._path(sizes, device))
            if config is None:
                return None
            self.chosen[sizes] = config
        return self.chosen[sizes]

    def pick(self, sizes: tuple, device, run) -> object:
        """The best config for these sizes; `run(config)` launches the kernel once with it."""
        config = self.known(sizes, device)
        if config is None and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return self.configs[0]  # timing would break the caller's CUDA graph capture: tuned later
        if config is None:
            path = self._path(sizes, device)
            timings = [(self._time(lambda c=c: run(c), device), k) for k, c in enumerate(self.configs)]
            best = min(timings)[1]
            if timings[best][0] > 0.97 * timings[0][0]:  # within noise of the heuristic's: keep it
                best = 0
            config = self.configs[best]
            log.debug("smelt: autotuned %s over %d configs: %s (%s) %s", self.name, len(self.configs), config,
                      ", ".join(f"{t * 1e3:.1f}us" for t, _ in timings), path)
            self._write(path, config)
        self.chosen[sizes] = config
        return config

    def _path(self, sizes, device) -> str:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        key = hashlib.sha256(f"{self.digest}|{name}|{sizes}|{TIMING}".encode()).hexdigest()[:32]
        return os.path.join(self.folder, f"{key}.json")

    def _read(self, path: str):
        try:
            with open(path) as f:
                fields = json.load(f)
            tiles = fields.pop("tiles", None)
            if tiles is not None:  # a tiled kernel's tile (artifact.TileBlocks), its tuple a list in JSON
                fields["tiles"] = TileBlocks(**{**tiles, "grid_axes": tuple(tiles["grid_axes"])})
            config = dataclasses.replace(self.configs[0], **fields)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            log.info("smelt: ignoring unreadable autotune entry %s: %s", path, e)
            return None
        if config not in self.configs:
            log.info("smelt: ignoring autotune entry %s: not one of this kernel's candidates", path)
            return None
        return config

    def _write(self, path: str, config) -> None:
        fields = {k: getattr(config, k) for k in ("XBLOCK", "RBLOCK", "num_warps")}
        if getattr(config, "tiles", None) is not None:
            fields["tiles"] = dataclasses.asdict(config.tiles)
        try:
            atomic_write(path, json.dumps(fields).encode())  # a reader never sees half a file
        except OSError as e:  # the choice still holds in this process
            log.warning("smelt: could not keep autotune entry %s (%s)", path, e)

    @staticmethod
    def _time(fn, device) -> float:
        """Median milliseconds of one launch."""
        fn()  # compiles
        if device.type == "cuda":
            with torch.cuda.device(device):  # where the kernel launches: its tensors' device
                return _queued(fn)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3


def _queued(fn, rounds: int = 3) -> float:
    """GPU milliseconds of one launch with the host's launch path out of it: the launches are queued
    behind a sleeping kernel and run back to back once it ends, on hot caches as in a model (where a
    kernel mostly reads what the one before it wrote). do_bench's flush and per-launch events held
    about 100 us a launch on the H200, so kernels of 5-20 us were picked by noise. On the current
    device and stream, where the launches go."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    launches = max(2, min(100, int(1.0 / max(start.elapsed_time(end) / 3, 1e-3))))  # about 1 ms of launches
    per_ms = _cycles_per_ms()
    # Enough sleep for 50 us of host time a launch (a tuning launch's host path timed 20-25 us on the
    # H200), doubled while the sleep ended before the last launch was queued and the launches' GPU time
    # does not outweigh the host's (the GPU may have waited for them), up to 200 ms.
    cycles = int(launches * 0.05 * per_ms)
    times = []
    while len(times) < rounds:
        torch.cuda._sleep(cycles)
        start.record()
        queued = time.perf_counter()
        for _ in range(launches):
            fn()
        end.record()
        queued = (time.perf_counter() - queued) * 1e3
        woke = start.query()
        end.synchronize()
        gpu = start.elapsed_time(end)
        host_bound = woke and gpu < 2 * queued
        if host_bound and cycles < 200 * per_ms:
            cycles *= 2
            continue
        if host_bound:
            log.debug("smelt: autotuning timed launches the host could not keep queued (%.1f us each)",
                      gpu / launches * 1e3)
        times.append(gpu / launches)
    return statistics.median(times)


_cycles: dict[int, float] = {}


def _cycles_per_ms() -> float:
    """The current device's sleep cycles a millisecond (its clock), measured once per device."""
    device = torch.cuda.current_device()
    if device not in _cycles:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # loads the sleep kernel before the timed one
        start.record()
        torch.cuda._sleep(1 << 21)
        end.record()
        end.synchronize()
        _cycles[device] = (1 << 21) / max(start.elapsed_time(end), 1e-3)
    return _cycles[device]
