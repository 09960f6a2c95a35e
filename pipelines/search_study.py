"""The Optuna side of `pipelines.search`: the study in SQLite next to the project, seeded TPE proposals, stale (killed)
trials failed and queued again, each trial's row, and the study's plots as PNGs."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.search_space import SearchSpace
from trainlab.core.errors import ParamsError
from trainlab.jobs.pruning import make_pruner, open_storage

STUDY_DB = "optuna.db"
SPACE_ATTR = "space_digest"
RUN_ATTR = "mlflow_run_id"  # a study's and a trial's MLflow run
EXPERIMENT_ATTR = "experiment"  # the trial's DVC experiment
ERROR_ATTR = "error"  # why a trial failed (a trial failed without it was killed: it is queued again)
TEST_ATTR = "test_metrics"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
PLOTS = ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values")


def storage_url(repo: Path) -> str:
    return f"sqlite:///{(repo / STUDY_DB).resolve()}"


def quiet_optuna() -> None:
    """Optuna's own per-trial log lines and experimental-feature warnings off: the search prints its own progress."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # the search beats its trials' heartbeats itself (one Prefect task a trial, asked and told here)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_study(repo: Path, space: SearchSpace, name: str, heartbeat_s: int,
               on_killed: Callable[[Any], None] | None = None):
    """The study `name` in <repo>/optuna.db, created or resumed; a trial whose heartbeat stopped (its search was
    killed) is failed and queued again with the same params, once; resuming with another space is refused."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    if not _NAME_RE.match(name):
        raise ParamsError(f"study name {name!r}: use letters, digits, '.', '_' and '-' (it names the trials' DVC "
                          "experiments)")
    quiet_optuna()
    retry = RetryHeartbeatStaleTrialCallback(max_retry=1)

    def stale(study, trial) -> None:
        if on_killed is not None:
            on_killed(trial)
        retry(study, trial)

    storage = open_storage(storage_url(repo), heartbeat_s, stale)
    study = optuna.create_study(study_name=name, storage=storage, direction=space.objective.direction,
                                pruner=make_pruner(space.pruner), sampler=sampler(space, 0), load_if_exists=True)
    digest = study.user_attrs.get(SPACE_ATTR)
    if digest is None:
        study.set_user_attr(SPACE_ATTR, space.digest())
        study.set_user_attr("space_file", str(space.path))
    elif digest != space.digest():
        raise ParamsError(f"study {name!r} in {repo / STUDY_DB} was made from another search space (or other "
                          f"objective, pruner or seed) than {space.path}; give --name for a new study")
    if study.direction.name.lower() != space.objective.direction:
        raise ParamsError(f"study {name!r} maximizes/minimizes the other way; give --name for a new study")
    return study


def sampler(space: SearchSpace, number: int):
    """TPE seeded with the space's seed plus `number`: a study asked one trial at a time proposes the same trials
    whether it ran in one go or was resumed."""
    import optuna

    return optuna.samplers.TPESampler(seed=space.seed + number, n_startup_trials=space.startup_trials,
                                      multivariate=True, group=True)


def ask(study, space: SearchSpace, running: int = 0) -> tuple[Any, dict[str, Any]]:
    """The next trial (a queued one first) and its overrides. The sampler is seeded by the count of trials started
    before it (finished, plus the `running` ones of this search): trials asked together get different seeds, and a
    trial killed and run again does not shift the proposals after it."""
    study.sampler = sampler(space, finished(study) + running)
    trial = study.ask()
    return trial, space.suggest(trial)


def finished(study) -> int:
    """Trials that count towards --trials: complete, pruned, or failed for a reason (not killed)."""
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and ERROR_ATTR in t.user_attrs))


def tell(study, trial, result: dict[str, Any] | BaseException) -> Any:
    """Finish `trial` with what its task returned (COMPLETE with its value, or PRUNED) or raised (FAIL)."""
    from optuna.trial import TrialState

    if isinstance(result, BaseException):
        trial.set_user_attr(ERROR_ATTR, str(result)[:2000])
        return study.tell(trial, state=TrialState.FAIL)
    if result.get(TEST_ATTR):
        trial.set_user_attr(TEST_ATTR, result[TEST_ATTR])
    if result["state"] == "PRUNED":
        return study.tell(trial, state=TrialState.PRUNED)
    reported = study._storage.get_trial(trial._trial_id).intermediate_values
    if len(reported) == len(result["history"]):  # the stage's own reports, unrounded: its last one is the value
        return study.tell(trial, reported[max(reported)])
    for epoch, value in enumerate(result["history"], start=1):  # restored from DVC's run cache: nothing trained
        trial.report(value, epoch)                               # to report, the history it kept says the same
    return study.tell(trial, result["value"])


def rows(study) -> list[dict[str, Any]]:
    """One row per trial of the study (every run of the search so far), in order."""
    out = []
    for t in study.get_trials(deepcopy=False):
        steps = sorted(t.intermediate_values)
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() \
            if t.datetime_complete and t.datetime_start else None
        out.append({"number": t.number, "experiment": t.user_attrs.get(EXPERIMENT_ATTR), "state": t.state.name,
                    "value": t.value, "last_epoch": steps[-1] if steps else None,
                    "last_value": t.intermediate_values[steps[-1]] if steps else None, "params": t.params,
                    "test": t.user_attrs.get(TEST_ATTR, {}), "mlflow_run_id": t.user_attrs.get(RUN_ATTR),
                    "seconds": round(seconds, 1) if seconds is not None else None,
                    "error": t.user_attrs.get(ERROR_ATTR)})
    return out


def best(study) -> dict[str, Any] | None:
    """The best complete trial's row, or None."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    number = study.best_trial.number
    return next(r for r in rows(study) if r["number"] == number)


def draw_plots(study, folder: Path) -> tuple[list[Path], list[str]]:
    """The study's history, importances, parallel coordinates and learning curves as PNGs (matplotlib); a plot that
    needs more trials than there are is skipped with the reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    folder.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for name in PLOTS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = getattr(ovm, f"plot_{name}")(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
            plt.close(figure)
            written.append(folder / f"{name}.png")
        except Exception as exc:  # noqa: BLE001 - a plot Optuna cannot draw (too few trials) must not cost the rest
            skipped.append(f"{name}: {type(exc).__name__}: {exc}")
    return written, skipped
