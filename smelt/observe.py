"""A record of what smelt compiled in this process, for tests, tools and curious users.

The latest graphs are held, older ones only while torch.compile's caches keep them: a process
that compiled thousands of graphs (the fuzzer) kept every kernel library mapped until it reached
vm.max_map_count."""
from __future__ import annotations

import collections
import weakref

KEPT = 32  # the latest graphs held even after their compiled function is gone (a test reads them)

_graphs: list[weakref.ref] = []
_latest: collections.deque = collections.deque(maxlen=KEPT)
# Called with each graph as it is recorded (smelt/report/ measures its kernels).
listeners: list = []


def record(graph) -> None:
    _graphs[:] = [g for g in _graphs if g() is not None]
    _graphs.append(weakref.ref(graph))
    _latest.append(graph)
    for listener in list(listeners):
        listener(graph)


def compiled_graphs() -> list:
    """The CompiledGraphs built since the last reset that are still in use or among the latest
    KEPT, in compile order."""
    return [g for g in (ref() for ref in _graphs) if g is not None]


def forget_latest() -> None:
    """Holds the latest graphs no more (torch._dynamo.reset(), through smelt's backend): those no
    compiled function holds are freed, and with them their CUDA graph recordings."""
    _latest.clear()


def reset() -> None:
    _graphs.clear()
    _latest.clear()
