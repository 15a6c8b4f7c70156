"""The backends smelt can print kernels with, by name: the one table that the settings (which
names SMELT_*_BACKEND accepts), code generation and the runtime read.

Each entry names two modules, imported when first asked for (so this table imports nothing and
sits below every package): the backend's code generator, which defines BACKEND (the protocol in
codegen/backends.py), and the runtime module whose `load(kernel, path, cache_dir, keep_kernels)`
makes what the wrapper calls for one of its kernels. Adding a backend is its package and one line here.
"""
from __future__ import annotations

from typing import NamedTuple


class Registered(NamedTuple):
    codegen: str
    runtime: str


BACKENDS = {
    "halide": Registered("smelt.codegen.halide.backend", "smelt.runtime.halide_loading"),
    # Its kernels are Python objects already: its own module loads them.
    "reference": Registered("smelt.codegen.reference.backend", "smelt.codegen.reference.backend"),
    "triton": Registered("smelt.codegen.triton.backend", "smelt.runtime.triton_loading"),
}
