"""A disk cache of compiled graphs, so that a second process compiling the same program skips the work.

Two levels, both under SMELT_CACHE_DIR and both off with SMELT_GRAPH_CACHE=0:
  - ATen graphs (every graph AOTAutograd hands smelt): keyed by the graph and its metadata, the
    entry holds the generated wrapper and kernel sources, so lowering, scheduling and code
    generation are skipped (`load_or_generate`).
  - Dynamo graphs that AOTAutograd turns into a plain inference graph, or a plain forward and
    backward pair: keyed by Dynamo's graph and its inputs, the entry points at the ATen entries, so
    AOTAutograd's tracing is skipped as well (`dynamo_level`, `training_graph`).
`stats` counts hits and misses in this process; hits and misses are logged at debug level on the
"smelt.graph_cache" logger, corrupted entries as warnings.
"""
from __future__ import annotations

import collections
import logging

from ..artifact import GeneratedGraph
from .fingerprint import Uncacheable, aten_graph_text, digest, environment_text
from .store import read_entry, write_entry

log = logging.getLogger("smelt.graph_cache")

stats: collections.Counter = collections.Counter()


def enabled(cfg) -> bool:
    # A debug dump shows every stage of a compile, so with SMELT_DEBUG_DIR set everything compiles.
    return cfg.graph_cache and not cfg.debug_dir


def aten_key(gm, kind: str, cfg, context: str = "") -> str:
    """`context`: what else decides the generated code (where a forward's saved values start)."""
    return digest(f"{environment_text(cfg)}\n{aten_graph_text(gm, kind)}\n{context}")


def replace(old: GeneratedGraph, new: GeneratedGraph, cfg) -> None:
    """`new` in the cache entry that held `old` (a graph generated again after a kernel failed to compile)."""
    if old.cache_key is None or not enabled(cfg):
        return
    if new.serializable:
        write_entry(cfg.cache_dir, "aten", old.cache_key, new.to_json())
        new.cache_key = old.cache_key
    else:
        log.debug("smelt: graph cache entry %s left as it was: the new graph refers to Python objects", old.cache_key[:16])


def load_generated(key: str, cfg) -> GeneratedGraph | None:
    body = read_entry(cfg.cache_dir, "aten", key)
    if body is None:
        return None
    try:
        return GeneratedGraph.from_json(body)
    except (KeyError, TypeError) as e:
        log.warning("smelt: ignoring graph cache entry %s with a wrong layout (%s)", key, e)
        return None


def load_or_generate(gm, kind: str, cfg, generate, context: str = "") -> GeneratedGraph:
    """The generated code of an ATen graph: from the cache when an entry exists, else `generate(gm,
    kind, cfg)`, written to the cache when it refers to nothing but source."""
    if not enabled(cfg):
        return generate(gm, kind, cfg)
    try:
        key = aten_key(gm, kind, cfg, context)
    except Uncacheable as e:
        stats["aten_uncacheable"] += 1
        log.debug("smelt: %s graph not cached: %s", kind, e)
        return generate(gm, kind, cfg)
    generated = load_generated(key, cfg)
    if generated is not None:
        stats["aten_hit"] += 1
        log.debug("smelt: graph cache hit for a %s graph (%s)", kind, key[:16])
        generated.cache_key = key
        return generated
    stats["aten_miss"] += 1
    generated = generate(gm, kind, cfg)
    if generated.serializable:
        write_entry(cfg.cache_dir, "aten", key, generated.to_json())
        generated.cache_key = key
    else:
        log.debug("smelt: %s graph not cached: it refers to Python objects (constants, subgraphs, kernels)", kind)
    return generated
