"""SMELT_DEBUG_DIR: every compiled graph's stages, one subfolder per graph."""
from __future__ import annotations

import itertools
import os

_counter = itertools.count()


def dump_graph(debug_dir: str, kind: str, files: dict[str, str]) -> str:
    folder = os.path.join(debug_dir, f"graph_{os.getpid()}_{next(_counter):03d}_{kind}")
    os.makedirs(folder, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder
