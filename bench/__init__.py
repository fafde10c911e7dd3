"""Benchmarks: scripts that print ratios against baselines measured in the same run (not tests)."""
