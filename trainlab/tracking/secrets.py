"""Secrets: credentials come from the environment and are never logged; passwords in URLs and values under
secret-looking keys are masked wherever we log or print."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Secrets: credentials come from the environment (MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY, ...) and are
# never logged; a password inside a URL, or a value under a secret-looking key, is masked wherever we log or print.

MASK = "***"
_SECRET_KEY_RE = re.compile(r"(^|[_.-])(password|passwd|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|"
                            r"credentials?|private[_-]?key)$", re.I)
_URL_CREDENTIALS_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/\s]*)@")


def redact(text: str) -> str:
    """`text` with the password of every ``scheme://user:password@host`` URL in it masked."""
    return _URL_CREDENTIALS_RE.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact_value(key: str, value: Any) -> Any:
    """A value to log under `key`: masked whole when the key names a secret, URL passwords masked otherwise."""
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(key, v) for v in value]
    if _SECRET_KEY_RE.search(key.rsplit(".", 1)[-1]) and value not in (None, ""):
        return MASK
    return redact(value) if isinstance(value, str) else value
