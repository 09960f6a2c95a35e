"""Peak memory while code runs: the CUDA caching allocator's peak on a GPU, the process RSS (sampled) on a CPU."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Self

import torch

MB = 2**20


def memory_kind(device: torch.device) -> str:
    return "cuda_allocator" if device.type == "cuda" else "process_rss"


class PeakMemory:
    """Context manager; `peak_mb` after exit: max CUDA allocated bytes, or the max process RSS sampled every
    `interval_s` (plus at entry and exit) on other devices."""

    def __init__(self, device: torch.device, interval_s: float = 0.005):
        self.device, self.interval_s = torch.device(device), interval_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_bytes = 0

    def _rss(self) -> int:
        return self._process.memory_info().rss

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak_bytes = max(self._peak_bytes, self._rss())

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            self._process = psutil.Process()
            self._peak_bytes = self._rss()
            self._thread = threading.Thread(target=self._sample, name="peak-rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / MB
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._peak_bytes = max(self._peak_bytes, self._rss())
        self.peak_mb = self._peak_bytes / MB


def write_cuda_memory_snapshot(step: Callable[[], None], path: Path, max_entries: int = 20_000) -> bool:
    """Record the CUDA allocator history over one call of `step` and write the snapshot as JSON (never a pickle).

    The JSON has the structure of torch.cuda.memory._snapshot() (segments, device_traces). Returns False when
    not on CUDA.
    """
    if not torch.cuda.is_available():
        return False
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries, clear_history=True)
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    path.write_text(json.dumps(snapshot, default=str))
    return True
