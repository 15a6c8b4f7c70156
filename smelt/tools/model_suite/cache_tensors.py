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


def cache_of(outputs):
    """The KV cache a model output carries (`cache` from transformers 5, `past_key_values` before)."""
    return outputs["cache"] if "cache" in outputs else outputs["past_key_values"]


def cache_kwargs(model, cache) -> dict:
    """The keyword that passes a KV cache to this model's forward."""
    import inspect
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache, "use_cache": True}
