"""Benchmarks and validation runs (``python -m benchmarks.<name>``); not part of the package."""
