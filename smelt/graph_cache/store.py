"""Cache entries on disk: one JSON file per key, written atomically, checked when read.

An entry repeats its key and carries a hash of its body, so a truncated, corrupted or misplaced
file is noticed, logged and ignored (the graph compiles again and the entry is rewritten).
"""
from __future__ import annotations

import json
import logging
import os

from ..runtime.checked_files import atomic_write
from .fingerprint import digest

log = logging.getLogger("smelt.graph_cache")

MAGIC = "smelt-graph-cache"


def entry_path(cache_dir: str, section: str, key: str) -> str:
    return os.path.join(cache_dir, "graphs", section, key[:2], f"{key}.json")


def read_entry(cache_dir: str, section: str, key: str) -> dict | None:
    path = entry_path(cache_dir, section, key)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("smelt: graph cache entry %s could not be read (%s); compiling again", path, e)
        return None
    try:
        entry = json.loads(data.decode("utf-8"))
        if entry.get("magic") != MAGIC or entry.get("key") != key:
            raise ValueError("it belongs to another key or is not a smelt cache entry")
        body = entry["body"]
        if digest(json.dumps(body, sort_keys=True)) != entry.get("body_sha256"):
            raise ValueError("its contents do not match their hash")
        return body
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("smelt: ignoring corrupted graph cache entry %s (%s: %s); compiling again",
                    path, type(e).__name__, e)
        return None


def write_entry(cache_dir: str, section: str, key: str, body: dict) -> None:
    path = entry_path(cache_dir, section, key)
    entry = {"magic": MAGIC, "key": key, "body_sha256": digest(json.dumps(body, sort_keys=True)), "body": body}
    try:
        # atomic: a reader sees the old entry or the new one, never half of one
        atomic_write(path, json.dumps(entry).encode("utf-8"))
    except OSError as e:
        log.warning("smelt: could not write graph cache entry %s (%s)", path, e)
