"""Benchmark harness comparing eager PyTorch, Inductor and smelt; entry point `python3 -m benchmarks.run`."""
