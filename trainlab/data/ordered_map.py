"""An ordered map on threads: a function over many items on all cores, results in the items' order, a chunk at a time,
each item's DataError returned in its place instead of stopping at the first (Pillow releases the GIL while it
decodes and resizes, so threads use every core)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from trainlab.core.errors import DataError

T = TypeVar("T")
R = TypeVar("R")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def map_in_order(items: Iterable[T], fn: Callable[[T], R], workers: int | None = None, chunk: int = 256,
                 progress: str | None = None, total: int | None = None) -> Iterator[tuple[T, R | DataError]]:
    """(item, fn(item) or the DataError it raised) for every item, in the items' order, `chunk` at a time on
    `workers` threads (default: the available cores). Results do not depend on the number of workers. `progress`:
    a bar with that title on a terminal (nothing in a log)."""
    workers = workers or available_cores()
    if progress is not None and sys.stderr.isatty():
        from tqdm import tqdm

        items = tqdm(items, desc=progress, total=total, unit="file", mininterval=0.5, leave=False)

    def safe(item: T) -> R | DataError:
        try:
            return fn(item)
        except DataError as exc:
            return exc

    batch: list[T] = []
    with ThreadPoolExecutor(max_workers=workers) if workers > 1 else _Inline() as pool:
        for item in items:
            batch.append(item)
            if len(batch) == chunk:
                yield from zip(batch, pool.map(safe, batch))
                batch = []
        if batch:
            yield from zip(batch, pool.map(safe, batch))


class _Inline:
    """A pool of no threads (workers=1): map in the caller's thread."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return [fn(item) for item in items]
