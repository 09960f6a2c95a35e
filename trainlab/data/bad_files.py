"""Unreadable files met while preparing: with data.bad_images "error" one error naming them all stops prepare; with
"skip" they are left out and listed in the data statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainlab.core.errors import DataError

BAD_FILES_SHOWN = 20  # bad files named in one error (reading stops at the next one)
BAD_IMAGES_KEY = "data.bad_images"


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
