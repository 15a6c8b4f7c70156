"""Turns a transformers KV cache into plain tensors, so the accuracy rule can compare caches."""
from __future__ import annotations


def cache_tensors(cache) -> list:
    """[[keys, values], ...] per layer of a DynamicCache (transformers 5's `layers`, or the legacy
    tuple form of older versions)."""
    if cache is None:
        return []
    if hasattr(cache, "layers"):
        return [[layer.keys, layer.values] for layer in cache.layers]
    if hasattr(cache, "to_legacy_cache"):
        return [list(kv) for kv in cache.to_legacy_cache()]
    return [list(kv) for kv in cache]


def outputs_with_plain_cache(outputs) -> dict:
    """A model output as a dict whose cache entry is its tensors."""
    out = dict(outputs)
    for key in ("cache", "past_key_values"):
        if key in out:
            out[key] = cache_tensors(out[key])
    return out
