"""Experiments behind figures in benchmarks/RESULTS.md; README.md here says what each measures."""
