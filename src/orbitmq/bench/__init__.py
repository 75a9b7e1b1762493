"""Benchmark scripts: `python -m orbitmq.bench store`."""
