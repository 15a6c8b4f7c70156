"""A record of what smelt compiled in this process, for tests, tools and curious users."""
from __future__ import annotations

_graphs: list = []


def record(graph) -> None:
    _graphs.append(graph)


def compiled_graphs() -> list:
    """Every CompiledGraph built since the last reset, in compile order."""
    return list(_graphs)


def reset() -> None:
    _graphs.clear()
