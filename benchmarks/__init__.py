"""pcgroups benchmarks: ``scripts/bench`` (``python -m benchmarks``). See BENCHMARKS.md."""
