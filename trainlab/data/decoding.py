"""Decoding many files on all cores, in order and a chunk at a time, collecting the bad ones instead of stopping at
the first (Pillow releases the GIL while it decodes and resizes, so threads use every core)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trainlab.core.errors import DataError

T = TypeVar("T")
R = TypeVar("R")

BAD_FILES_SHOWN = 20  # bad files named in one error (decoding stops at the next one)
BAD_IMAGES_KEY = "data.bad_images"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass
class BadFiles:
    """Unreadable files met while preparing: with ``mode`` "error" they stop prepare with one error naming them all
    (up to BAD_FILES_SHOWN); with "skip" they are left out and listed in the data statistics."""

    mode: str = "error"
    where: str = "data"
    found: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    def add(self, error: DataError, path: Path | str) -> None:
        reason = str(error)
        prefix = f"{path}: "
        self.found.append((str(path), reason[len(prefix):] if reason.startswith(prefix) else reason))
        if self.mode == "error" and len(self.found) > BAD_FILES_SHOWN:
            self.fail(stopped=True)

    def check(self) -> None:
        """The error listing every bad file, in "error" mode; nothing in "skip" mode or when all files were good."""
        if self.found and self.mode == "error":
            self.fail(stopped=False)

    def fail(self, stopped: bool) -> None:
        if len(self.found) == 1:
            path, reason = self.found[0]
            raise DataError(f"{path}: {reason}; fix or remove it, or set {BAD_IMAGES_KEY}: skip to leave it out")
        shown = self.found[:BAD_FILES_SHOWN]
        lines = [f"  {path}: {reason}" for path, reason in shown]
        more = "  (stopped there: more files may be bad)\n" if stopped else ""
        count = f"more than {BAD_FILES_SHOWN}" if stopped else str(len(self.found))
        raise DataError(f"{self.where}: {count} unreadable image file(s):\n" + "\n".join(lines) + "\n" + more
                        + f"fix or remove them, or set {BAD_IMAGES_KEY}: skip to leave them out (they are then "
                        "listed in reports/data_stats.json)")

    def record(self) -> dict:
        """What the data statistics keep: the count and the files with their reasons."""
        return {"count": len(self.found), "files": [{"path": p, "reason": r} for p, r in self.found]}


def decode_in_order(items: Iterable[T], decode: Callable[[T], R], workers: int | None = None,
                    chunk: int = 256, progress: str | None = None,
                    total: int | None = None) -> Iterator[tuple[T, R | DataError]]:
    """(item, result or the DataError it raised) for every item, in the items' order, decoded `chunk` at a time on
    `workers` threads (default: the available cores). Results do not depend on the number of workers. `progress`:
    a bar with that title on a terminal (nothing in a log)."""
    workers = workers or available_cores()
    if progress is not None and sys.stderr.isatty():
        from tqdm import tqdm

        items = tqdm(items, desc=progress, total=total, unit="file", mininterval=0.5, leave=False)

    def safe(item: T) -> R | DataError:
        try:
            return decode(item)
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
