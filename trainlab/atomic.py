"""Safe file writes (a temp file beside the target, then os.replace: no half-written outputs) and process locks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temp path in the target's folder; on success it replaces the target, on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():
            os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give it a normal file's mode
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside `target`; on success it replaces `target` whole, on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


@contextmanager
def process_lock(name: str, wait: bool = True) -> Iterator[bool]:
    """An exclusive inter-process lock (flock) named by `name`, on a file in the temp dir (nothing is written beside
    the caller's files). Yields True while held; with ``wait=False``, yields False at once if another process holds
    it. Where flock does not exist (not POSIX), yields True without locking."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"trainlab-{digest}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
