"""Run one DVC stage (DVC decides whether it is up to date) and tell transient failures from permanent ones."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipelines.dag import StageInfo
from pipelines.dvc_cli import CommandResult, run_dvc, stage_changes
from trainlab.core.errors import (
    CheckpointError,
    DataError,
    OutputNotWritten,
    ParamsError,
    TrackingUnavailable,
    TrainingDiverged,
    TrialPruned,
    UserError,
)

# A stage that exits with one of these failed on its input: running it again cannot help.
PERMANENT_EXIT_CODES: dict[int, str] = {
    cls.exit_code: label for cls, label in (
        (ParamsError, "bad params"), (DataError, "bad data"),
        (CheckpointError, "checkpoint mismatch"), (TrainingDiverged, "training diverged"),
        (OutputNotWritten, "disk full"))
}
KEY_METRIC_PREFIXES = ("test_", "baseline_")
MAX_KEY_METRICS = 12

_EXIT_RE = re.compile(r"exited with (-?\d+)")
_MARKERS = (
    (re.compile(r"^Running stage '(?P<stage>.+)':"), "ran"),
    (re.compile(r"^Stage '(?P<stage>.+)' didn't change, skipping"), "skipped"),
    (re.compile(r"^Stage '(?P<stage>.+)' is cached - skipping run, checking out outputs"), "restored"),
)


class StageFailed(UserError):
    """A stage's command failed; `exit_code` is what the stage itself exited with when that is known."""

    permanent = False

    def __init__(self, stage: str, message: str, stage_exit_code: int | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.stage_exit_code = stage_exit_code
        self.exit_code = stage_exit_code if self.permanent and stage_exit_code else 1


class PermanentStageError(StageFailed):
    """Bad params, bad data, a mismatched checkpoint or a diverged run: fails at once, never retried."""

    permanent = True


class PrunedStageError(PermanentStageError):
    """The stage exited 9: a search trial's pruner stopped its training (no outputs); a result, never retried."""


class TransientStageError(StageFailed):
    """Anything else (a crash, a killed process, DVC's lock held by another command): retried with backoff."""


class TrackingDownStageError(StageFailed):
    """The stage exited 6: its MLflow server is unreachable (its outputs may be written and its calls spooled).
    Retried only once the server answers again (the rerun then replays the spool instead of training)."""

    permanent = True

    def __init__(self, stage: str, message: str, stage_exit_code: int | None, tracking_uri: str | None) -> None:
        super().__init__(stage, message, stage_exit_code)
        self.tracking_uri = tracking_uri

    def server_answers(self) -> bool:
        if not self.tracking_uri or not self.tracking_uri.lower().startswith(("http://", "https://")):
            return False
        from trainlab.tracking.uri import _probe_health

        return _probe_health(self.tracking_uri, 5) is None


@dataclass
class StageOutcome:
    """What happened to one stage in a pipeline run."""

    stage: str
    status: str                       # ran | restored | skipped | failed | not_run
    seconds: float = 0.0
    reason: str = ""                  # why it ran (what DVC saw change), or why it failed / did not run
    metrics: dict[str, float] = field(default_factory=dict)
    mlflow_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def execute_stage(stage: StageInfo, workspace: str | os.PathLike, env: Mapping[str, str],
                  log: Callable[[str], None] = print) -> StageOutcome:
    """Ask DVC whether `stage` is up to date; if not, `dvc repro --single-item` it. Raises StageFailed."""
    started = time.perf_counter()
    changes = stage_changes(stage.name, workspace, env)
    if not changes:
        log(f"{stage.name}: up to date (dvc status is clean), skipped")
        return StageOutcome(stage.name, "skipped", time.perf_counter() - started, "up to date",
                            read_key_metrics(stage, workspace))
    reason = describe_changes(changes)
    log(f"{stage.name}: {reason}; running `dvc repro --single-item {stage.name}`")
    result = run_dvc(["repro", "--single-item", stage.name], workspace, env, on_line=log)
    if result.returncode != 0:
        raise stage_failure(stage.name, result, env.get("MLFLOW_TRACKING_URI"))
    restored = any(status == "restored" for _, status in parse_repro_log(result.lines))
    outcome = StageOutcome(stage.name, "restored" if restored else "ran", time.perf_counter() - started, reason,
                           read_key_metrics(stage, workspace))
    log(f"{stage.name}: {outcome.status} in {outcome.seconds:.1f} s")
    return outcome


def stage_failure(stage: str, result: CommandResult, tracking_uri: str | None = None) -> StageFailed:
    """The error for a failed `dvc repro`: permanent when the stage exited with a user-error code."""
    codes = [int(m.group(1)) for line in result.lines for m in [_EXIT_RE.search(line)] if m]
    code = codes[-1] if codes else None
    detail = stage_error_message(result.lines)
    if code == TrackingUnavailable.exit_code:
        return TrackingDownStageError(
            stage, f"stage {stage} failed (MLflow server unreachable, exit {code}; not retried while it is down): "
            f"{detail}", code, tracking_uri)
    if code == TrialPruned.exit_code:
        return PrunedStageError(stage, f"stage {stage} pruned (exit {code}; not retried): {detail}", code)
    if code in PERMANENT_EXIT_CODES:
        return PermanentStageError(
            stage, f"stage {stage} failed ({PERMANENT_EXIT_CODES[code]}, exit {code}; not retried): {detail}", code)
    what = f"exited with {code}" if code is not None else f"dvc exited with {result.returncode}"
    return TransientStageError(stage, f"stage {stage} failed ({what}): {detail}", code)


def stage_error_message(lines: list[str]) -> str:
    """The stage's own `error: ...` report (with its indented detail lines), else DVC's ERROR line."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error: "):
            detail = [lines[i][len("error: "):]]
            detail += [line.strip() for line in lines[i + 1:i + 4] if line.startswith((" ", "\t"))]
            return " ".join(detail)
    errors = [line for line in lines if line.startswith("ERROR")]
    if errors:
        return errors[-1]
    return " | ".join(line.strip() for line in lines[-5:] if line.strip()) or "(no output)"


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry anything except a PermanentStageError or another user error."""
    exc = state.data if isinstance(getattr(state, "data", None), BaseException) else None
    if exc is None:
        try:
            exc = state.result(raise_on_failure=False)
        except Exception as err:  # noqa: BLE001 - a result that cannot be read: judge the error itself
            exc = err
    if isinstance(exc, TransientStageError):
        return True
    if isinstance(exc, TrackingDownStageError):
        return exc.server_answers()
    return not isinstance(exc, UserError)


def parse_repro_log(lines: list[str]) -> list[tuple[str, str]]:
    """(stage, ran|skipped|restored) for each stage a `dvc repro` log mentions, in order (last word wins)."""
    seen: dict[str, str] = {}
    for line in lines:
        for pattern, status in _MARKERS:
            m = pattern.match(line.strip())
            if m:
                stage = m.group("stage")
                seen[stage] = "restored" if seen.get(stage) == "ran" and status == "restored" else status
    return list(seen.items())


def describe_changes(changes: list) -> str:
    """A short reading of `dvc status` entries: 'changed deps (params.yaml), changed outs'."""
    parts = []
    for entry in changes:
        if isinstance(entry, str):
            parts.append(entry)
        elif isinstance(entry, dict):
            for kind, what in entry.items():
                paths = ", ".join(list(what)[:3]) if isinstance(what, dict) else ""
                parts.append(f"{kind} ({paths})" if paths else str(kind))
    return "; ".join(parts) or "changed"


def read_key_metrics(stage: StageInfo, workspace: str | os.PathLike) -> dict[str, float]:
    """The headline numbers of a stage's metrics files: top-level numbers (`test_*`/`baseline_*` first, only
    those when there are any), else the numbers one level down (`classifier.accuracy`); per-class detail is left out."""
    top: dict[str, float] = {}
    nested: dict[str, float] = {}
    for rel in stage.metrics:
        data = _load_metrics(Path(workspace) / rel)
        top.update({k: v for k, v in data.items() if _is_number(v)})
        nested.update({f"{k}.{kk}": vv for k, v in data.items() if isinstance(v, dict)
                       for kk, vv in v.items() if _is_number(vv)})
    headline = {k: v for k, v in top.items() if k.startswith(KEY_METRIC_PREFIXES)} or top or nested
    return {k: float(v) for k, v in list(headline.items())[:MAX_KEY_METRICS]}


def _load_metrics(path: Path) -> dict:
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
