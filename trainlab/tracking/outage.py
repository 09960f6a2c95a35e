"""What an MLflow error means: the server did not answer (an outage: keep the call, retry it later) or it answered
with a refusal (a deleted experiment, a failed migration, a rejected call): the only tracking error that stops a
stage."""

from __future__ import annotations

from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.secrets import redact

# What MLflow's REST client says when the request never got an answer (it wraps the requests error in its message).
_OUTAGE_MARKERS = ("failed with exception", "failed with timeout exception", "max retries exceeded",
                   "connection refused", "connection aborted", "remote end closed", "read timed out",
                   "temporarily unavailable", "database is locked", "bad gateway", "service unavailable")
_OUTAGE_CODES = ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")


class TrackingOutage(TrackingUnavailable):
    """The MLflow server went away during the stage and did not come back within `tracking.outage_grace_s`."""


def is_outage(exc: BaseException) -> bool:
    """True when `exc` means "the server did not answer" (worth retrying later), not "the server said no"."""
    import requests

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
            return True
        text = str(current).lower()
        if any(marker in text for marker in _OUTAGE_MARKERS):
            return True
        if getattr(current, "error_code", "") in _OUTAGE_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an error's message (its type when it has none), for a one-line report."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]


def refusal(exc: BaseException, what: str, uri: str) -> TrackingUnavailable:
    """A refusal as the error a stage exits with (6): `exc` itself when it already is one, else a TrackingUnavailable
    saying what was refused (`what`) by which store."""
    if isinstance(exc, TrackingUnavailable):
        return exc
    return TrackingUnavailable(f"MLflow store {redact(uri)} refused {what}: {first_line(exc, 300)}")
