"""One hash of smelt's own source: what the graph cache and the kept kernel binaries are keyed by."""
from __future__ import annotations

import functools
import hashlib
import os


@functools.lru_cache(maxsize=None)
def smelt_source_digest() -> str:
    """One hash of every Python file of smelt: any change to the compiler invalidates the cache."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()
