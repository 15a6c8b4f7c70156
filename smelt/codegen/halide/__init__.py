"""Halide code generation: one pipeline per scheduled step, with its CPU or GPU schedule."""
