"""torch.profiler over one training step: a Chrome trace (JSON) and the table of the top operators."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trainlab.profiling.peaks import synchronize

TOP_OPS = 15


def trace_step(step: Callable[[], None], device: torch.device, trace_path: Path, top_ops_path: Path,
               warmup: int = 1, title: str = "") -> None:
    """Run `warmup` untraced calls of `step`, then profile one call: write its Chrome trace (open it in
    chrome://tracing or https://ui.perfetto.dev) and the top operators by self time (CPU, and device on CUDA)."""
    if device.type != "cuda":
        # Kineto (the profiler's backend) logs GPU-query errors and start/stop lines even for CPU-only traces;
        # read once, at the first profile in the process. A value the user set wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    for _ in range(warmup):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        synchronize(device)
    prof.export_chrome_trace(str(trace_path))
    averages = prof.key_averages()
    sections = []
    if device.type == "cuda":
        sections.append(("self device (CUDA) time", "self_device_time_total"))
    sections.append(("self CPU time", "self_cpu_time_total"))
    text = [f"{title}\n" if title else ""]
    for label, key in sections:
        text.append(f"Top {TOP_OPS} operators by {label}\n")
        text.append(averages.table(sort_by=key, row_limit=TOP_OPS))
        text.append("\n")
    top_ops_path.write_text("\n".join(part for part in text if part))
