"""Pruning for a search trial: a training stage run by `pipelines.search` reports its validation metric each epoch to
its Optuna trial and stops (exit 9) when the study's pruner says so. Without $TRAINLAB_TRIAL nothing changes and Optuna
is never imported."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainlab.core.atomic import process_lock
from trainlab.core.errors import ParamsError, TrialPruned

TRIAL_ENV = "TRAINLAB_TRIAL"  # JSON: storage, study, trial_id, number, task, metric, pruner (set by pipelines.search)
PRUNED_TAG = "optuna_trial_state"
SQLITE_TIMEOUT_S = 60  # the search process and its trials' stages write to one SQLite file


def make_pruner(spec: Mapping[str, Any] | None):
    """The Optuna pruner a search space's `pruner:` section names: median, percentile, threshold or none."""
    import optuna

    spec = dict(spec or {"kind": "none"})
    kind = spec.pop("kind", "none")
    # epochs are reported as steps 1, 2, ...; Optuna protects the steps below n_warmup_steps
    warmup, startup = spec.pop("warmup_epochs", 0) + 1, spec.pop("startup_trials", 5)
    if kind == "none":
        return optuna.pruners.NopPruner()
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if kind == "percentile":
        return optuna.pruners.PercentilePruner(spec.pop("percentile", 25.0), n_startup_trials=startup,
                                               n_warmup_steps=warmup)
    if kind == "threshold":
        return optuna.pruners.ThresholdPruner(lower=spec.pop("lower", None), upper=spec.pop("upper", None),
                                              n_warmup_steps=warmup)
    raise ParamsError(f"pruner kind {kind!r}: choose median, percentile, threshold or none")


def open_storage(url: str, heartbeat_s: int | None = None, on_stale=None):
    """Optuna's RDB storage at `url`, waiting for SQLite's lock rather than failing; with `heartbeat_s`, a trial that
    has not beaten for twice that long is failed (and `on_stale` called for it)."""
    import optuna

    kwargs: dict[str, Any] = {"heartbeat_interval": heartbeat_s, "grace_period": 2 * heartbeat_s,
                              "heartbeat_stale_trial_callback": on_stale} if heartbeat_s else {}
    # the first opener creates and stamps the schema; two at once on a new file collide (alembic_version UNIQUE)
    with process_lock(f"optuna-init:{url}"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}},
                                          **kwargs)


class PruningSink:
    """A MetricsSink that passes every call on to `inner` and reports `metric` at each epoch to the trial; when the
    pruner stops the trial, the checkpoint goes (it must not be resumed as a finished run) and TrialPruned is raised."""

    def __init__(self, inner: Any, trial_spec: Mapping[str, Any], checkpoint: Path | None) -> None:
        import optuna

        self.inner, self.spec, self.checkpoint = inner, dict(trial_spec), checkpoint
        self.metric = self.spec["metric"]
        storage = open_storage(self.spec["storage"])
        study = optuna.load_study(study_name=self.spec["study"], storage=storage,
                                  pruner=make_pruner(self.spec.get("pruner")))
        self.trial = optuna.trial.Trial(study, int(self.spec["trial_id"]))
        self.reported: set[int] = set()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.inner is not None:
            self.inner.log_metrics(metrics, step=step)
        if step is None or self.metric not in metrics:
            return
        # reported by epoch (trials of other batch sizes align), the first validation of each: with validations
        # within an epoch, the later ones of that epoch are the tracker's alone
        epoch = int(metrics.get("epoch", step))
        if epoch in self.reported:
            return
        self.reported.add(epoch)
        value = float(metrics[self.metric])
        self.trial.report(value, epoch)
        if self.trial.should_prune():
            self.prune(epoch, value)

    def prune(self, epoch: int, value: float) -> None:
        if self.checkpoint is not None:
            Path(self.checkpoint).unlink(missing_ok=True)
        where = f"trial {self.spec.get('number', '?')} of study {self.spec['study']}"
        if self.inner is not None and hasattr(self.inner, "set_tags"):
            self.inner.set_tags({PRUNED_TAG: "PRUNED", "optuna_study": self.spec["study"],
                                 "optuna_trial": str(self.spec.get("number", "")), "pruned_at_epoch": str(epoch)})
        raise TrialPruned(f"{where} pruned at epoch {epoch} ({self.metric} {value:.4g}: the study's "
                          f"{self.spec.get('pruner', {}).get('kind', '')} pruner stopped it); no model or report "
                          "written, checkpoint removed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def trial_sink(tracker: Any, task: str, checkpoint: Path | None = None) -> Any:
    """`tracker`, wrapped to report to the search trial $TRAINLAB_TRIAL names when that trial optimises `task` (on
    rank 0 under DDP); otherwise `tracker` itself."""
    raw = os.environ.get(TRIAL_ENV, "").strip()
    if not raw or os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone reports
        return tracker
    try:
        spec = json.loads(raw)
        missing = [k for k in ("storage", "study", "trial_id", "task", "metric") if k not in spec]
    except (json.JSONDecodeError, TypeError):
        spec, missing = None, ["(not a JSON object)"]
    if not isinstance(spec, dict) or missing:
        raise ParamsError(f"${TRIAL_ENV}: expected the JSON that pipelines.search sets, missing {', '.join(missing)}; "
                          f"unset it to train outside a search")
    return PruningSink(tracker, spec, checkpoint) if spec["task"] == task else tracker
