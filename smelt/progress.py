"""How far a slow compile has got: kernels built of the graph's total.

Nothing is said for a compile that ends within SLOW_SECONDS. Past that, a line goes to the `smelt`
logger (INFO) every EVERY_SECONDS, and with SMELT_PROGRESS=1 a bar is drawn on stderr when it is
a terminal, redrawn in place and cleared at the end.
"""
from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("smelt")

SLOW_SECONDS = 2.0
EVERY_SECONDS = 5.0
BAR_WIDTH = 30


class Progress:
    def __init__(self, what: str, total: int, bar: bool = False, stream=None):
        self.what = what
        self.total = total
        self.done = 0
        self.start = time.perf_counter()
        self.told = None  # when the last log line went out
        self.stream = stream if stream is not None else sys.stderr
        self.bar = bar and getattr(self.stream, "isatty", lambda: False)()
        self.drawn = False

    def step(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < SLOW_SECONDS:
            return
        if self.told is None or now - self.told >= EVERY_SECONDS:
            self.told = now
            log.info("smelt: %s: %d of %d kernels built (%.1f s)", self.what, self.done, self.total, elapsed)
        if self.bar:
            filled = BAR_WIDTH * self.done // max(1, self.total)
            self.stream.write(f"\rsmelt {self.what}: [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                              f"{self.done}/{self.total} kernels {elapsed:.1f} s")
            self.stream.flush()
            self.drawn = True

    def close(self) -> None:
        elapsed = time.perf_counter() - self.start
        if self.told is not None:
            log.info("smelt: %s: all %d kernels built in %.1f s", self.what, self.total, elapsed)
        if self.drawn:
            self.stream.write("\r\033[K")  # the bar's line, cleared
            self.stream.flush()
