"""Safe file writes (a temp file beside the target, then os.replace: no half-written outputs) and process locks."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainlab.core.errors import OutputNotWritten

_FULL = {errno.EFBIG: "file too large: a file-size limit was reached", errno.ENOSPC: "no space left on the device",
         errno.EDQUOT: "disk quota exceeded"}
_OS_ERROR_RE = re.compile(r"os error (\d+)")


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
    except Exception as exc:
        _raise_if_full(exc, tmp_path, target, target)
        raise
    finally:
        tmp_path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside `target`; on success it replaces `target` whole, on error it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        try:
            yield tmp
        except Exception as exc:
            # the file being written when it failed (a writer that removes its half file names it with `writing`)
            written = getattr(exc, "trainlab_path", None) or max(
                (p for p in tmp.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime_ns, default=tmp)
            _raise_if_full(exc, written, target / Path(written).relative_to(tmp), target)
            raise
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


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Mark an error raised inside as one of writing `path` (for writers that remove their half file on failure)."""
    try:
        yield
    except Exception as exc:
        exc.trainlab_path = Path(path)
        raise


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


def _raise_if_full(exc: BaseException, tmp: Path, shown: Path, target: Path) -> None:
    """Raise OutputNotWritten naming `shown` when `exc` came from a full disk or a file-size limit (EFBIG, ENOSPC,
    EDQUOT): read from the error itself or, where the writer hides it (torch.save says 'unexpected pos'), by
    writing one more byte to the half-written temp file, which fails the same way."""
    reason = _full_reason(exc) or _append_refused(tmp)
    if reason is None:
        return
    kept = "the previous version is unchanged" if target.exists() else "nothing was written"
    raise OutputNotWritten(f"{shown}: could not be written ({reason}); {kept}. Free disk space (or raise the "
                           "limit) and run the same command again") from None


def _full_reason(exc: BaseException | None) -> str | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return _FULL[exc.errno]
        match = _OS_ERROR_RE.search(str(exc))  # safetensors: "I/O error: File too large (os error 27)"
        if match and int(match.group(1)) in _FULL:
            return _FULL[int(match.group(1))]
        exc = exc.__cause__ or exc.__context__
    return None


def _append_refused(path: Path) -> str | None:
    try:
        if not path.is_file():
            return None
        with open(path, "ab") as handle:
            handle.write(b"\0")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        return _FULL.get(exc.errno)
    return None
