"""Triton code generation: one kernel per scheduled step, combo kernels, finishers, launch settings."""
