"""The backends smelt can print kernels with, by name: the one table that the settings (which
names SMELT_*_BACKEND accepts), code generation and the runtime read.

Each module named defines BACKEND (the protocol in codegen/backends.py). It is imported when first
asked for, so this table imports nothing and sits below every package. Adding a backend is its
package and one line here.
"""

BACKENDS = {
    "halide": "smelt.codegen.halide.backend",
    "reference": "smelt.codegen.reference.backend",
    "triton": "smelt.codegen.triton.backend",
}
