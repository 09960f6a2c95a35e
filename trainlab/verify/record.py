"""The recorded run that verify checks, read from a model folder (its reports/<task>/run.json, else the MLflow run
tagged with its weights' md5), an MLflow run (`runs:/<id>`) or a DVC training stage."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainlab.verify import CouldNotRerun

TRAIL_ARTIFACT = "trail.json"  # trainlab.jobs.train.TRAIL_ARTIFACT


@dataclass
class RunRecord:
    """What a training run left to be checked by: its fingerprint and trail, what a rerun needs, its metrics."""

    source: str
    task: str
    rerun: dict[str, Any]
    fingerprint: dict[str, str]
    trail: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    test: dict[str, float] = field(default_factory=dict)
    model_md5: str = ""
    train_time_s: float | None = None

    @classmethod
    def of(cls, data: dict[str, Any], source: str) -> RunRecord:
        if not data.get("trail") or not data.get("rerun"):
            raise CouldNotRerun(f"{source}: no trail or rerun record (the run was trained before trainlab recorded "
                                "them); train it again with this version, then verify")
        return cls(source=source, task=data["rerun"]["task"], rerun=data["rerun"],
                   fingerprint=data.get("fingerprint") or data["trail"].get("fingerprint", {}), trail=data["trail"],
                   history=data.get("history", []), test=data.get("test", {}), model_md5=data.get("model_md5", ""),
                   train_time_s=(data.get("timing") or {}).get("train_time_s"))


def load_record(target: str, root: Path) -> RunRecord:
    """The record of `target`: `runs:/<run id>`, a model folder, or the name of a training stage in dvc.yaml."""
    if target.startswith("runs:/"):
        run_id = target.removeprefix("runs:/").strip("/").split("/")[0]
        return from_mlflow(run_id, root, target)
    path = Path(target)
    if (path / "info.json").is_file():
        return from_model_dir(path, root)
    stages = _dvc_stages(root)
    if target in stages or f"train_{target}" in stages:
        model_dir = _stage_model_dir(stages, target if target in stages else f"train_{target}")
        return from_model_dir(root / model_dir, root)
    raise CouldNotRerun(f"{target}: not a model folder (no info.json), a runs:/<id> URI or a training stage of "
                        f"{root / 'dvc.yaml'} ({', '.join(s for s in stages if s.startswith('train_')) or 'none'})")


def from_model_dir(model_dir: Path, root: Path) -> RunRecord:
    from trainlab.tracking.lineage import file_md5

    info = json.loads((model_dir / "info.json").read_text())
    task = info["task"]
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise CouldNotRerun(f"{weights}: missing (dvc pull or dvc repro to restore it)")
    md5 = file_md5(weights)
    seen = []
    for record in dict.fromkeys([root / "reports" / task / "run.json",
                                 model_dir.resolve().parent.parent / "reports" / task / "run.json"]):
        if record.is_file():
            data = json.loads(record.read_text())
            if data.get("model_md5") == md5:
                return RunRecord.of(data, str(record))
            seen.append(f"{record} is of another model")
    found = _mlflow_run_of_model(md5, root)
    if found is not None:
        return from_mlflow(found, root, f"runs:/{found}")
    raise CouldNotRerun(f"{model_dir}: no record of the run that trained it ({'; '.join(seen) or 'no run.json'}; "
                        f"no MLflow run tagged model_md5={md5})")


def tracking_uri(root: Path) -> str:
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    from trainlab.tracking.uri import default_tracking_uri

    return default_tracking_uri(root)


def from_mlflow(run_id: str, root: Path, source: str) -> RunRecord:
    from trainlab.tracking.uri import mlflow_client

    uri = tracking_uri(root)
    try:
        client = mlflow_client(uri)
        with tempfile.TemporaryDirectory(prefix="trainlab-verify-") as tmp:
            path = client.download_artifacts(run_id, TRAIL_ARTIFACT, tmp)
            data = json.loads(Path(path).read_text())
    except Exception as exc:  # noqa: BLE001 - an unknown run, a missing artifact, an unreachable store
        raise CouldNotRerun(f"{source}: could not read its {TRAIL_ARTIFACT} from the MLflow store {uri} "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    return RunRecord.of(data, source)


def _mlflow_run_of_model(md5: str, root: Path) -> str | None:
    """The id of the MLflow run tagged model_md5=`md5` in this repo's store, if there is one."""
    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    from trainlab.tracking.uri import mlflow_client

    try:
        client = mlflow_client(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, filter_string=f"tags.model_md5 = '{md5}'", max_results=1)
    except Exception:  # noqa: BLE001 - no store here: the caller says what it looked for
        return None
    return runs[0].info.run_id if runs else None


def _dvc_stages(root: Path) -> dict[str, Any]:
    path = root / "dvc.yaml"
    return (yaml.safe_load(path.read_text()) or {}).get("stages", {}) if path.is_file() else {}


def _stage_model_dir(stages: dict[str, Any], name: str) -> str:
    """A training stage's model folder: the second path of its command (`python -m stages.X DATA MODEL REPORTS`)."""
    argv = shlex.split(stages[name]["cmd"])
    if len(argv) < 5 or not argv[2].startswith("stages.train_"):
        raise CouldNotRerun(f"dvc.yaml stage {name}: not a training stage ({stages[name]['cmd']})")
    return argv[4]
