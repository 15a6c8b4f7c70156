"""Files in smelt's cache that are written whole or not at all, and checked before they are used.

A damaged shared library kills the process that loads it (SIGBUS on a truncated one), so every
cached library gets a sidecar `<file>.sha256` holding its hash, written after the library itself;
a library whose hash does not match (or that has no sidecar: its writer stopped between the two)
is not loaded but built again. Every write goes to a temporary name in the same folder and is
renamed over the target, so a reader (another process, or this one after a crash) sees the old
file or the new one, never half of one; a file already mapped by a running process keeps its inode.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile

log = logging.getLogger("smelt.runtime")

MISSING = "is missing"
_verified: dict[str, tuple] = {}  # path -> (size, mtime_ns, inode) when its hash last matched


def atomic_write(path: str, data: bytes) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def install(built: str, path: str) -> None:
    """Moves the finished file `built` (in the same folder's filesystem) to `path`, then writes its hash."""
    digest = _sha256(built)
    os.replace(built, path)
    atomic_write(path + ".sha256", digest.encode())
    _verified[path] = _identity(path)


def problem(path: str) -> str | None:
    """None when `path` exists and matches its recorded hash, else what is wrong (MISSING when
    there is no file). Changes nothing: a file may be half-installed by another process, so only
    the holder of the file's build lock acts on the answer (`discard`)."""
    try:
        identity = _identity(path)
    except FileNotFoundError:
        return MISSING
    if _verified.get(path) == identity:  # hashed once per process while the file stays the same
        return None
    try:
        with open(path + ".sha256", "rb") as f:
            expected = f.read().decode(errors="replace").strip()
        if _sha256(path) != expected:
            return "does not match its recorded hash"
    except FileNotFoundError:
        return "has no recorded hash (its writer stopped before finishing)"
    except OSError as e:
        return f"could not be read ({e})"
    _verified[path] = identity
    return None


def discard(path: str, problem: str) -> None:
    """Removes a damaged cached file, with a warning, before it is built again."""
    log.warning("smelt: cached file %s %s: building it again", path, problem)
    _verified.pop(path, None)
    try:
        os.unlink(path)
    except OSError:
        pass
