"""Benchmarks: workloads, throughput and latency figures, sweeps, roofline."""
