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


class Autotuner:
    def __init__(self, source: str, configs: list, cache_dir: str):
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
        if config is None:
            path = self._path(sizes, device)
            timings = [(self._time(lambda c=c: run(c), device), k) for k, c in enumerate(self.configs)]
            best = min(timings)[1]
            config = self.configs[best]
            log.debug("smelt: autotuned %s over %d configs: %s (%s)", path, len(self.configs), config,
                      ", ".join(f"{t * 1e3:.1f}us" for t, _ in timings))
            self._write(path, config)
        self.chosen[sizes] = config
        return config

    def _path(self, sizes, device) -> str:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        key = hashlib.sha256(f"{self.digest}|{name}|{sizes}".encode()).hexdigest()[:32]
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
            from triton.testing import do_bench
            return float(do_bench(fn, warmup=5, rep=25, return_mode="median"))
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3
