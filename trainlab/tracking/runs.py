"""Opening a stage's MLflow run: the plan (experiment, name, tags, parent, datasets, environment), worked out locally,
and the opening itself, the only part that talks to the server; `start_run` does both and ends the run."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainlab.core.atomic import process_lock
from trainlab.core.errors import TrackingUnavailable
from trainlab.core.flatten import stringify
from trainlab.core.provenance import environment, git_state, loaded_torch
from trainlab.tracking.lineage import DataInput, data_hash, dataset_inputs, dataset_records
from trainlab.tracking.retry import retry
from trainlab.tracking.secrets import redact, redact_value
from trainlab.tracking.tracker import MlflowTracker, NullTracker
from trainlab.tracking.uri import artifact_location, configure_http, mlflow_client, resolve_tracking_uri, sqlite_path

if TYPE_CHECKING:
    from trainlab.core.config import Params


PARENT_RUN_ENV = "TRAINLAB_PARENT_RUN_ID"
DVC_EXP_NAME_ENV = "DVC_EXP_NAME"  # set by `dvc exp run`, and by the flows for their experiments and sweep points
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
OPEN_ID_TAG = "trainlab.open_id"  # one per planned run: opening it again (after an outage, from a spool) finds it


def default_run_name(stage: str, git: Mapping[str, str]) -> str:
    """What the runs table shows: the DVC experiment (or sweep point) and the stage, else the stage and the short
    commit (``-dirty`` when what the stage reads differs from it: `git_state`). Set here, so MLflow never draws a name
    from the seeded `random`."""
    experiment = os.environ.get(DVC_EXP_NAME_ENV, "").strip()
    if experiment:
        return f"{experiment} {stage}"
    commit = str(git.get("git_commit") or "unknown")
    short = commit[:7] if commit != "unknown" else "no-git"
    return f"{stage} {short}" + ("-dirty" if git.get("git_dirty") == "true" else "")


@dataclass
class RunPlan:
    """Everything a stage's run is opened with, worked out without the server: plain data, so that a spool can keep
    it when the server was away the whole stage, and its replay opens the run as the stage would have."""

    tracking_uri: str
    experiment: str
    run_name: str
    tags: dict[str, str]
    parent_run_id: str | None = None
    datasets: list[dict[str, str]] = dataclasses.field(default_factory=list)  # lineage.dataset_records
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)  # logged as environment.json
    register_models: bool = True
    open_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunPlan:
        return cls(**data)


def plan_run(params: Params, stage: str, uri: str, run_name: str | None = None, parent_run_id: str | None = None,
             tags: Mapping[str, Any] | None = None, device: str | None = None,
             datasets: Sequence[DataInput] = ()) -> RunPlan:
    """The plan of a stage's run in the store at `uri` (see `start_run`); reads files and git, not the server."""
    run_tags = _run_tags(params, stage, device)
    run_tags.update({str(k): redact_value(str(k), stringify(v)) for k, v in (tags or {}).items()})
    parent = parent_run_id or os.environ.get(PARENT_RUN_ENV, "").strip() or None
    plan = RunPlan(uri, params.tracking.experiment, run_name or default_run_name(stage, run_tags), run_tags, parent,
                   dataset_records(datasets), _environment(run_tags.get("device"), stage),
                   params.tracking.register_models)
    plan.tags[OPEN_ID_TAG] = plan.open_id
    return plan


def open_run(plan: RunPlan, find_first: bool = False) -> MlflowTracker:
    """Open the planned run: the experiment (made if needed), the run with its parent, dataset inputs and environment
    record. `find_first`: an earlier try may have created it before its answer was lost; take that one if so.
    A server that does not answer raises what MLflow raised (trainlab.tracking.outage.is_outage says which)."""
    db = sqlite_path(plan.tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow 3.17's SQLAlchemy stores create and migrate a fresh DB without a lock (the client does it on
    # construction), so processes starting together on a new mlflow.db break each other's migration:
    # serialise the first touch and the experiment's get-or-create across processes.
    with process_lock(f"mlflow-init:{db}") if db is not None else nullcontext():
        client = mlflow_client(plan.tracking_uri)
        experiment_id = _ensure_experiment(client, plan.experiment,
                                           artifact_location(plan.tracking_uri, plan.experiment))
    run_id = _planned_run(client, experiment_id, plan.open_id) if find_first else None
    if run_id is None:
        tags = dict(plan.tags)
        if plan.parent_run_id:
            if _run_exists(client, plan.parent_run_id):
                tags["mlflow.parentRunId"] = plan.parent_run_id
            else:
                print(f"warning: parent run {plan.parent_run_id} not found in {redact(plan.tracking_uri)}; not "
                      "nesting this run", file=sys.stderr)
        run_id = retry(client.create_run, experiment_id, tags=tags, run_name=plan.run_name).info.run_id
    if plan.datasets:
        retry(client.log_inputs, run_id, datasets=dataset_inputs(plan.datasets))
    tracker = MlflowTracker(client, run_id, experiment_id, plan.tracking_uri, plan.register_models)
    tracker.log_dict(plan.environment, "environment.json")
    return tracker


def _planned_run(client: Any, experiment_id: str, open_id: str) -> str | None:
    runs = retry(client.search_runs, [experiment_id], filter_string=f"tags.`{OPEN_ID_TAG}` = '{open_id}'",
                 max_results=1)
    return runs[0].info.run_id if runs else None


@contextmanager
def start_run(params: Params, stage: str, run_name: str | None = None, parent_run_id: str | None = None,
              tags: Mapping[str, Any] | None = None, device: str | None = None,
              datasets: Sequence[DataInput] = ()) -> Iterator[MlflowTracker | NullTracker]:
    """One MLflow run for a stage, opened now; yields its tracker. The run ends FAILED if the body raises (KILLED on
    Ctrl-C), else FINISHED.

    With ``tracking.enabled`` false, yields a NullTracker and touches nothing. ``parent_run_id`` (or
    ``$TRAINLAB_PARENT_RUN_ID``) nests the run. Tags: git_commit, git_dirty, stage, params_hash, data_hash,
    device, torch_version (when the stage has loaded torch); the environment record is logged as
    ``environment.json``. ``device`` names the device the stage runs on (default: resolved from ``base.device``).
    ``run_name`` defaults to `default_run_name`; ``datasets`` are logged as the run's dataset inputs.
    """
    if not params.tracking.enabled:
        yield NullTracker()
        return
    uri = resolve_tracking_uri(params, check=True)  # probes http(s) servers before importing mlflow
    configure_http(params.tracking.request_timeout_s, params.tracking.request_retries)
    tracker = open_run(plan_run(params, stage, uri, run_name, parent_run_id, tags, device, datasets))
    status, body_raised = "FINISHED", False
    try:
        yield tracker
    except BaseException as exc:
        body_raised = True
        status = run_status(exc)
        raise
    finally:
        try:
            tracker.end(status)
        except Exception as exc:
            if not body_raised:
                raise
            print(f"warning: could not mark MLflow run {tracker.run_id} {status}: {exc}", file=sys.stderr)


def run_status(exc: BaseException | None) -> str:
    """How a run ends when its stage's body ended with `exc` (None: it returned)."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
        return "FINISHED"
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


def _ensure_experiment(client: Any, name: str, artifact_location: str | None) -> str:
    """The experiment's id, creating it if needed; safe when several processes create it at once.

    It carries ``mlflow.experimentKind = custom_model_development`` (added to an existing experiment that has no
    kind), so MLflow 3's UI opens it in the model-training view rather than the GenAI one."""
    experiment = retry(client.get_experiment_by_name, name)
    if experiment is None:
        try:
            return retry(client.create_experiment, name, artifact_location=artifact_location,
                          tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:
            # Most likely another process created it between our get and create: use theirs.
            experiment = retry(client.get_experiment_by_name, name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise TrackingUnavailable(
            f"MLflow experiment {name!r} is deleted; restore it (`mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}`) or set another `tracking.experiment` in params.yaml")
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        retry(client.set_experiment_tag, experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def _run_exists(client: Any, run_id: str) -> bool:
    try:
        retry(client.get_run, run_id)
        return True
    except Exception as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return False
        raise


def _resolve_device_name(params: Params, device: str | None) -> str:
    if device:
        return str(device)
    try:
        from trainlab.core.runtime import resolve_device

        return str(resolve_device(params.base.device))
    except Exception:  # noqa: BLE001 - a tag must never stop a run
        return params.base.device


def _run_tags(params: Params, stage: str, device: str | None) -> dict[str, str]:
    tags: dict[str, str] = {}
    try:  # mlflow's own context tags (user, source name/type), as the fluent API would add them
        from mlflow.tracking.context.registry import resolve_tags

        tags.update({k: str(v) for k, v in resolve_tags({}).items()})
    except Exception:  # noqa: BLE001 - cosmetic
        pass
    tags.update(git_state(stage=stage))  # dirty: what this stage reads differs from the commit
    tags.update({
        "stage": stage,
        "params_hash": params.section_hash(),
        "data_hash": data_hash(stage),
        "device": _resolve_device_name(params, device),
    })
    torch = loaded_torch()  # a stage that never uses torch (the TF-IDF baseline) is not made to load it for a tag
    if torch is not None:
        tags["torch_version"] = torch.__version__
    return tags


def _environment(device_tag: str | None, stage: str) -> dict[str, str]:
    torch = loaded_torch()
    try:
        dev = torch.device(device_tag) if device_tag and torch is not None else None
    except (RuntimeError, TypeError):
        dev = None
    try:
        return environment(dev, stage)
    except Exception:  # noqa: BLE001 - e.g. a CUDA query failing; record what we can
        return environment(None, stage)