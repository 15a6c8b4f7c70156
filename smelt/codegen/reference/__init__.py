"""The reference backend: runs a kernel's loop bodies directly as torch operations on whole
tensors, with no code generation. It is the oracle that tells a lowering bug (the reference is
wrong too) from a code-generation bug (only Halide or Triton is): SMELT_CPU_BACKEND=reference."""
