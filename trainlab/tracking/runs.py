"""Opening a stage's MLflow run: experiment, name, tags, parent, datasets; in the background while training starts."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any


from trainlab.core.flatten import stringify
from trainlab.core.atomic import process_lock
from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.lineage import DataInput, data_hash, dataset_inputs
from trainlab.tracking.retry import retry
from trainlab.tracking.secrets import redact, redact_value
from trainlab.tracking.tracker import MlflowTracker, NullTracker
from trainlab.tracking.uri import artifact_location, mlflow_client, resolve_tracking_uri, sqlite_path

if TYPE_CHECKING:

    from trainlab.core.config import Params


PARENT_RUN_ENV = "TRAINLAB_PARENT_RUN_ID"
DVC_EXP_NAME_ENV = "DVC_EXP_NAME"  # set by `dvc exp run`, and by the flows for their experiments and sweep points
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def default_run_name(stage: str, git: Mapping[str, str]) -> str:
    """What the runs table shows: the DVC experiment (or sweep point) and the stage, else the stage and the short
    commit (``-dirty`` with uncommitted changes). Set here, so MLflow never draws a name from the seeded `random`."""
    experiment = os.environ.get(DVC_EXP_NAME_ENV, "").strip()
    if experiment:
        return f"{experiment} {stage}"
    commit = str(git.get("git_commit") or "unknown")
    short = commit[:7] if commit != "unknown" else "no-git"
    return f"{stage} {short}" + ("-dirty" if git.get("git_dirty") == "true" else "")


@contextmanager
def start_run(params: Params, stage: str, run_name: str | None = None, parent_run_id: str | None = None,
              tags: Mapping[str, Any] | None = None, device: str | None = None,
              datasets: Sequence[DataInput] = ()) -> Iterator[MlflowTracker | NullTracker]:
    """One MLflow run for a stage; yields a tracker. The run ends FAILED if the body raises, else FINISHED.

    With ``tracking.enabled`` false, yields a NullTracker and touches nothing. ``parent_run_id`` (or
    ``$TRAINLAB_PARENT_RUN_ID``) nests the run. Tags: git_commit, git_dirty, stage, params_hash, data_hash,
    device, torch_version; the environment record is logged as ``environment.json``. ``device`` names the
    device the stage runs on (default: resolved from ``base.device``). ``run_name`` defaults to
    `default_run_name`; ``datasets`` are logged as the run's dataset inputs.
    """
    if not params.tracking.enabled:
        yield NullTracker()
        return

    uri = resolve_tracking_uri(params, check=True)  # probes http(s) servers before importing mlflow
    from trainlab.tracking.queue import configure_http
    configure_http(params.tracking.request_timeout_s, params.tracking.request_retries)

    from mlflow.entities import RunStatus

    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow 3.17's SQLAlchemy stores create and migrate a fresh DB without a lock (the client does it on
    # construction), so processes starting together on a new mlflow.db break each other's migration:
    # serialise the first touch and the experiment's get-or-create across processes.
    with process_lock(f"mlflow-init:{db}") if db is not None else nullcontext():
        client = mlflow_client(uri)
        experiment_id = _ensure_experiment(client, params.tracking.experiment,
                                           artifact_location(uri, params.tracking.experiment))

    run_tags = _run_tags(params, stage, device)
    parent = parent_run_id or os.environ.get(PARENT_RUN_ENV, "").strip() or None
    if parent:
        if _run_exists(client, parent):
            run_tags["mlflow.parentRunId"] = parent
        else:
            print(f"warning: parent run {parent} not found in {redact(uri)}; not nesting this run", file=sys.stderr)
    run_tags.update({str(k): redact_value(str(k), stringify(v)) for k, v in (tags or {}).items()})
    run_name = run_name or default_run_name(stage, run_tags)
    run = retry(client.create_run, experiment_id, tags=run_tags, run_name=run_name)
    if datasets:
        retry(client.log_inputs, run.info.run_id, datasets=dataset_inputs(datasets))
    tracker = MlflowTracker(client, run.info.run_id, experiment_id, uri, params.tracking.register_models)

    status, body_raised = RunStatus.to_string(RunStatus.FINISHED), False
    try:
        tracker.log_dict(_environment(device_tag=run_tags.get("device")), "environment.json")
        yield tracker
    except BaseException as exc:
        body_raised = True
        if isinstance(exc, KeyboardInterrupt):
            status = RunStatus.to_string(RunStatus.KILLED)
        elif not (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            status = RunStatus.to_string(RunStatus.FAILED)
        raise
    finally:
        try:
            if not tracker.end_deferred:
                retry(client.set_terminated, tracker.run_id, status)
        except Exception as exc:
            if not body_raised:
                raise
            print(f"warning: could not mark MLflow run {tracker.run_id} {status}: {exc}", file=sys.stderr)


class PendingTracker:
    """The tracker of a run that `start_run_in_background` is opening on a thread.

    Logging calls made before the run is open are queued and replayed, in order, by the first call after it is;
    anything else (``run_id``, ``log_model``, ...) waits for it. If opening fails, ``failed`` is set and every later
    call raises the error opening raised."""

    _QUEUEABLE = frozenset({"log_params", "log_metrics", "set_tags", "log_dict", "log_text"})

    def __init__(self, opening: Future) -> None:
        self._opening = opening
        self._queued: list[tuple[str, tuple, dict]] = []
        self.failed = threading.Event()
        opening.add_done_callback(lambda f: self.failed.set() if f.exception() is not None else None)

    def wait(self) -> MlflowTracker:
        """The open run's tracker, once every queued call has been made on it; raises what opening raised."""
        tracker = self._opening.result()
        while self._queued:
            name, args, kwargs = self._queued.pop(0)
            getattr(tracker, name)(*args, **kwargs)
        return tracker

    def opening_error(self) -> BaseException | None:
        """What opening the run raised (None if it opened), once opening has finished."""
        return self._opening.exception()

    def __getattr__(self, name: str) -> Any:
        if name not in self._QUEUEABLE:
            return getattr(self.wait(), name)

        def call(*args: Any, **kwargs: Any) -> None:
            if self._opening.done():
                getattr(self.wait(), name)(*args, **kwargs)
            else:
                self._queued.append((name, args, kwargs))

        return call


@contextmanager
def start_run_in_background(params: Params, stage: str, spool_key: str | None = None,
                            outputs: tuple[Path, ...] = (), **kwargs: Any) -> Iterator[PendingTracker | NullTracker]:
    """`start_run` on a thread, so that importing MLflow and opening its store (about 1.5 s on a 2-core CPU) overlap
    the caller's work instead of delaying it: a training stage's first step comes that much sooner. Every logging
    call goes through a bounded queue to a background thread (`trainlab.tracking.queue.QueuedTracker`), so training
    never waits on the server; a server that went away and is not back `tracking.outage_grace_s` after the body ends
    gets the calls left spooled under `spool_key` with copies of `outputs`, and TrackingOutage (exit 6).

    The caller should pass the tracker's ``failed`` event to `fit(stop=...)`, so training stops at its next step
    (with a checkpoint to resume from) if the run cannot be opened; that error is then what this raises."""
    if not params.tracking.enabled:
        yield NullTracker()
        return
    from trainlab.tracking.queue import queued_run

    with queued_run(start_run(params, stage, **kwargs), params.tracking, stage, spool_key, outputs) as tracker:
        yield tracker


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
    import torch

    from trainlab.core.repro import git_state

    tags: dict[str, str] = {}
    try:  # mlflow's own context tags (user, source name/type), as the fluent API would add them
        from mlflow.tracking.context.registry import resolve_tags

        tags.update({k: str(v) for k, v in resolve_tags({}).items()})
    except Exception:  # noqa: BLE001 - cosmetic
        pass
    tags.update(git_state())
    tags.update({
        "stage": stage,
        "params_hash": params.section_hash(),
        "data_hash": data_hash(stage),
        "device": _resolve_device_name(params, device),
        "torch_version": torch.__version__,
    })
    return tags


def _environment(device_tag: str | None) -> dict[str, str]:
    import torch

    from trainlab.core.repro import environment

    try:
        dev = torch.device(device_tag) if device_tag else None
    except (RuntimeError, TypeError):
        dev = None
    try:
        return environment(dev)
    except Exception:  # noqa: BLE001 - e.g. a CUDA query failing; record what we can
        return environment(None)
