"""MLflow glue for the flows: the repo's tracking URI, the parent run of a flow run, its child stage runs."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from trainlab.core.config import Params
from trainlab.tracking.runs import DVC_EXP_NAME_ENV, PARENT_RUN_ENV, start_run
from trainlab.tracking.tracker import NullTracker, flatten_params
from trainlab.tracking.uri import mlflow_client, resolve_tracking_uri


def tracking_uri(root: str | os.PathLike, params: Params) -> str | None:
    """Where the stages of `root` log: `tracking.uri`, else $MLFLOW_TRACKING_URI, else `<root>/mlflow.db`;
    relative SQLite paths are taken from `root` (so experiments in other folders log to the same store).
    None when tracking is off."""
    return resolve_tracking_uri(params, root=root) if params.tracking.enabled else None


def stage_run_env(uri: str | None, parent_run_id: str | None, experiment: str | None = None) -> dict[str, str]:
    """What a stage subprocess needs to log to the same store, nested under the flow's parent run; for a DVC
    experiment (or sweep point) its name, as `dvc exp run` sets it, which the stage's run name starts with."""
    env: dict[str, str] = {DVC_EXP_NAME_ENV: experiment} if experiment else {}
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    if parent_run_id:
        env[PARENT_RUN_ENV] = parent_run_id
    return env


@contextmanager
def parent_run(params: Params, root: str | os.PathLike, name: str, kind: str,
               tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None) -> Iterator[Any]:
    """An MLflow run for a flow run (or a sweep point), in the repo's store; a NullTracker when tracking is off."""
    uri = tracking_uri(root, params)
    if uri is None:
        yield NullTracker()
        return
    pinned = params.model_copy(update={"tracking": params.tracking.model_copy(update={"uri": uri})})
    all_tags = {"params_hash": params.section_hash(), "trainlab_flow": kind, **(tags or {})}
    with start_run(pinned, stage=kind, run_name=name, parent_run_id=parent_run_id, tags=all_tags) as tracker:
        yield tracker


def child_runs(uri: str | None, parent_run_id: str | None) -> dict[str, str]:
    """{stage tag: run id} of the runs nested under `parent_run_id` (the newest per stage)."""
    if not uri or not parent_run_id:
        return {}
    client = mlflow_client(uri)
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                              order_by=["attributes.start_time ASC"], max_results=1000)
    return {run.data.tags.get("stage", run.info.run_name): run.info.run_id for run in runs}


def log_summary(tracker: Any, summary: Mapping[str, Any]) -> None:
    """The flow's summary on its parent run: a JSON artifact, per-stage seconds and key metrics, status tags."""
    if not getattr(tracker, "run_id", ""):
        return
    tracker.log_dict(dict(summary), "pipeline_summary.json")
    metrics: dict[str, float] = {"pipeline_seconds": float(summary.get("seconds", 0.0))}
    tags: dict[str, str] = {}
    for stage in summary.get("stages", []):
        key = stage["stage"].replace(":", "/")
        metrics[f"{key}.seconds"] = float(stage["seconds"])
        metrics.update({f"{key}.{k}": float(v) for k, v in stage.get("metrics", {}).items()})
        tags[f"stage_status.{key}"] = stage["status"]
    tracker.log_metrics(metrics)
    tracker.set_tags(tags)


def log_overrides(tracker: Any, overrides: Mapping[str, Any], experiment: str | None) -> None:
    """Overrides as params of the parent run (dotted keys), plus the DVC experiment name."""
    if not getattr(tracker, "run_id", ""):
        return
    values = {k: v for k, v in flatten_params(dict(overrides)).items()}
    if experiment:
        values["dvc_experiment"] = experiment
    if values:
        tracker.log_params(values)
