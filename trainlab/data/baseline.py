"""The text baseline's file (baseline.json, written by the text_baseline stage): its name and its checked reading."""

from __future__ import annotations

import json
from pathlib import Path

from trainlab.core.errors import DataError

BASELINE_FILE = "baseline.json"


def read_baseline(path: Path) -> dict:
    """A baseline.json the text_baseline stage wrote; a DataError naming the file when it is missing or malformed."""
    try:
        result = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing (run `dvc repro text_baseline`)") from None
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not all(isinstance(result.get(k), (int, float)) for k in ("accuracy", "macro_f1")):
        raise DataError(f"{path}: expected numbers 'accuracy' and 'macro_f1' (run `dvc repro text_baseline`)")
    return result
