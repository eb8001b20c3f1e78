"""Helpers of benchmarks/bench_peers.py: the throttling proxy, the format writers and
the per-system epoch runners (each system runs in a process of its own)."""
