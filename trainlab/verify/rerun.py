"""Train a recorded run again in a temporary workspace: its training stage, its params as written (tracking off), its
prepared data; whole, or stopped after some epochs (its checkpoint then holds the trail)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainlab.verify import CouldNotRerun
from trainlab.verify.record import RunRecord

REPO = Path(__file__).resolve().parents[2]  # where `stages` is importable
STOPPED = 130  # a stage stopped after its epochs (TRAINLAB_STOP_AFTER_EPOCHS): TrainingInterrupted's exit code


@dataclass
class Rerun:
    """What a training run here produced: its trail and fingerprint, history, test metrics (a whole run only)."""

    workspace: Path
    trail: dict[str, Any]
    history: list[dict[str, Any]]
    seconds: float  # the whole rerun, process start to end
    train_time_s: float | None = None  # its training alone
    test: dict[str, float] = field(default_factory=dict)
    model_md5: str = ""

    @property
    def fingerprint(self) -> dict[str, str]:
        return self.trail.get("fingerprint", {})

    def checkpoint(self, task: str) -> Path:
        return self.workspace / "checkpoints" / task / "last.pt"


def check_inputs(record: RunRecord) -> None:
    """The recorded data folder (and the stage's option files) exist here, with the recorded bytes."""
    from trainlab.core.fingerprint import files_digest

    data_dir = Path(record.rerun["data_dir"])
    if not data_dir.is_dir():
        raise CouldNotRerun(f"{data_dir}: the run's prepared data folder is missing here (dvc pull, or dvc repro "
                            "prepare with the same params)")
    recorded = record.fingerprint.get("data_hash")
    here = files_digest(data_dir)
    if recorded and here != recorded:
        raise CouldNotRerun(f"{data_dir}: the prepared data differ from the recorded run's (hash {here} here, "
                            f"{recorded} recorded): prepare it with the run's params and data first")
    for name, value in record.rerun.get("options", {}).items():
        if isinstance(value, str) and value.startswith("/") and not Path(value).exists():
            raise CouldNotRerun(f"{value}: the stage's --{name.replace('_', '-')} file is missing here")


def stage_command(record: RunRecord, workspace: Path) -> list[str]:
    task = record.task
    argv = [sys.executable, "-m", f"stages.train_{task}", record.rerun["data_dir"], str(workspace / "models" / task),
            str(workspace / "reports" / task)]
    for name, value in record.rerun.get("options", {}).items():
        if value is not None and value is not False:
            argv += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return argv


def rerun(record: RunRecord, workspace: Path, epochs: int | None = None, trail_every: int | None = None,
          checkpoint: Path | None = None, label: str = "rerun") -> Rerun:
    """Train `record`'s run again in `workspace` (created): the whole run, or up to the end of epoch `epochs`;
    resumed from `checkpoint` when given; with a trail record every `trail_every` steps when given."""
    workspace.mkdir(parents=True, exist_ok=True)
    params = json.loads(json.dumps(record.rerun["params"]))
    params.setdefault("tracking", {})["enabled"] = False
    (workspace / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if checkpoint is not None:
        target = workspace / "checkpoints" / record.task / "last.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(checkpoint, target)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1"}
    for key, value in (("TRAINLAB_STOP_AFTER_EPOCHS", epochs), ("TRAINLAB_TRAIL_EVERY", trail_every)):
        if value:
            env[key] = str(value)
        else:
            env.pop(key, None)
    log = workspace / f"{label}.log"
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(stage_command(record, workspace), cwd=workspace, env=env, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    seconds = time.perf_counter() - started
    if code == 0:
        data = json.loads((workspace / "reports" / record.task / "run.json").read_text())
        return Rerun(workspace, data["trail"], data.get("history", []), seconds,
                     (data.get("timing") or {}).get("train_time_s"), data.get("test", {}), data.get("model_md5", ""))
    saved = workspace / "checkpoints" / record.task / "last.pt"
    if code == STOPPED and epochs and saved.is_file():
        from trainlab.engine.checkpoint import load_checkpoint

        state = load_checkpoint(saved)
        history = [{k: v for k, v in row.items() if k != "samples_per_s"} for row in state.get("history", [])]
        return Rerun(workspace, state.get("trail") or {}, history, seconds, state.get("train_time"))
    tail = "\n".join(log.read_text().strip().splitlines()[-8:])
    raise CouldNotRerun(f"the {label} of {record.task} ({' '.join(stage_command(record, workspace)[1:3])}) exited "
                        f"{code}; its log {log} ends:\n{tail}")
