"""The cache folder a compile writes to: SMELT_CACHE_DIR when smelt can write there, else a
private temporary folder for this process, with the disk cache off and one warning.

Kernels need a place on disk even without a cache (Halide libraries are loaded from files, Triton
reads a kernel's source back from its module), so an unusable folder never fails a compile.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import os
import shutil
import tempfile

log = logging.getLogger("smelt")
SECTIONS = ("sources", "halide", "graphs", "autotune", "kernels")  # what smelt writes below the folder


def _problem(folder: str) -> str | None:
    """Why `folder` cannot hold smelt's cache, or None. Created user-only where missing; a test
    file written and removed, since permission bits do not tell (root writes anywhere, a read-only
    mount refuses everyone)."""
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # The folder and the sections already in it (another user's, in a shared folder).
        for section in [folder, *(os.path.join(folder, s) for s in SECTIONS)]:
            if section == folder or os.path.isdir(section):
                fd, probe = tempfile.mkstemp(dir=section, prefix=".smelt_probe_")
                os.close(fd)
                os.unlink(probe)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


@functools.lru_cache(maxsize=None)
def resolve(folder: str) -> tuple[str, bool]:
    """(the folder to write to, whether it persists across processes); once per process per folder."""
    problem = _problem(folder)
    if problem is None:
        return folder, True
    private = tempfile.mkdtemp(prefix="smelt_nocache_")  # mode 0o700
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    log.warning("smelt: cannot use the cache folder %s (%s); compiling without the disk cache, kernels go to %s "
                "for this process. Set SMELT_CACHE_DIR to a folder you can write to.", folder, problem, private)
    return private, False


def usable(cfg):
    """`cfg` with a cache folder that can be written to; the graph cache off where it is a private one."""
    folder, persists = resolve(cfg.cache_dir)
    if persists:
        return cfg
    return dataclasses.replace(cfg, cache_dir=folder, graph_cache=False)
