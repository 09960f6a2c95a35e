"""Retries of MLflow calls that hit SQLite's "database is locked" (several stages logging to one file at once)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

_LOCKED_MARKER = "database is locked"
_RETRY_TRIES = 5
_RETRY_BASE_DELAY_S = 0.2
# A private RNG for retry jitter: the global `random` stream belongs to the seeded training code.
_jitter = random.Random()

T = TypeVar("T")


def _is_locked(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if _LOCKED_MARKER in str(exc).lower():
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call an MLflow client function, retrying with jittered backoff when SQLite says 'database is locked'."""
    for attempt in range(_RETRY_TRIES):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if attempt == _RETRY_TRIES - 1 or not _is_locked(exc):
                raise
            time.sleep(_RETRY_BASE_DELAY_S * 2**attempt * (0.5 + _jitter.random()))
    raise AssertionError("unreachable")


def already_exists(exc: BaseException) -> bool:
    code = getattr(exc, "error_code", "")
    return code in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS") or "already exists" in str(exc).lower()
