"""Profiling: throughput per setting, FLOPs, MFU against measured and datasheet peaks, memory, profiler traces.
Import the module you need: a package import loads none of them."""
