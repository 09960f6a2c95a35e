"""Hyperparameter search: an Optuna study (TPE, seeded) over a search space file. Each trial is a DVC experiment run
as a Prefect task on the sweep's path and a nested MLflow run under the study's run; its training stage reports the
validation metric every epoch and stops when the pruner says so. The study lives in optuna.db next to the project, so
running the same command again resumes it (a trial killed with the search is run again).

    python -m pipelines.search pipelines/spaces/classifier.yaml --trials 16 --parallel 2
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from pipelines import overrides as ov
from pipelines import search_study as st
from pipelines.dag import StageInfo, find_root, read_stages
from pipelines.execute import PrunedStageError, is_transient
from pipelines.experiment import experiment_run
from pipelines.runs import log_summary, parent_run, tracking_uri
from pipelines.search_space import SearchSpace, load_space
from pipelines.sweep import POINT_RETRIES, POINT_RETRY_DELAY_S, repro_and_save
from pipelines.workspace import ExperimentError, check_experiment_name
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.errors import DataError, ParamsError, UserError
from trainlab.core.provenance import git_state
from trainlab.jobs.pruning import PRUNED_TAG, TRIAL_ENV

DEFAULT_TRIALS = 16
DEFAULT_HEARTBEAT_S = 30
REPORTS = Path("reports") / "search"  # <study>/summary.json and the plots (git-ignored)


@task(name="search-trial", task_run_name="{name}", cache_policy=NO_CACHE, retries=POINT_RETRIES,
      retry_delay_seconds=exponential_backoff(POINT_RETRY_DELAY_S), retry_condition_fn=is_transient)
def run_trial(root: str, name: str, overrides: dict[str, Any], stages: list[StageInfo], study_run_id: str | None,
              targets: list[str], trial: dict[str, Any], history: str) -> dict[str, Any]:
    """One trial: `dvc repro` in its own workspace with the trial named to the training stage ($TRAINLAB_TRIAL), saved
    as `dvc exp` NAME when it completes; a pruned stage (exit 9) is a result, not a failure, and is never retried."""
    logger = get_run_logger()
    started = time.perf_counter()
    repo = Path(root)
    params = ov.validated_params(repo, overrides)
    tags = {"optuna_study": trial["study"], "optuna_trial": str(trial["number"])}
    with experiment_run(repo, params, overrides, name, stages, f"trial {name}", "trial", logger.info, tags=tags,
                        parent_run_id=study_run_id) as run:
        if run.tracker.run_id:
            _storage(trial["storage"]).set_trial_user_attr(trial["trial_id"], st.RUN_ATTR, run.tracker.run_id)
        run.env[TRIAL_ENV] = json.dumps(trial)
        try:
            point = {**repro_and_save(run, repo, name, overrides, stages, targets, logger.info, started),
                     "state": "COMPLETE"}
            point["history"] = read_history(run.workspace / history, trial["metric"])
            point["value"] = point["history"][-1]
            stopped = plateau_record(run.workspace / "models" / trial["task"] / "info.json")
            if stopped:  # epochs auto: the run kept its best validation's weights, so that is what it scored
                point["value"], point["stopping"] = stopped.get(f"best_{trial['metric']}", point["value"]), stopped
                logger.info(f"trial {name}: stopped by its plateau schedule at epoch {stopped['stopped_epoch']} "
                            f"({stopped['why']}), not pruned; scored by epoch {stopped['best_epoch']}'s weights")
            point[st.TEST_ATTR] = {k: v for s in point["stages"] if s["stage"] == trial["stage"]
                                   for k, v in s["metrics"].items()}
        except PrunedStageError as exc:
            point = {"name": name, "overrides": overrides, "state": "PRUNED", "reason": str(exc),
                     "mlflow_run_id": run.tracker.run_id or None, "seconds": round(time.perf_counter() - started, 3)}
        log_summary(run.tracker, point)
        if run.tracker.run_id:
            run.tracker.set_tags({PRUNED_TAG: point["state"]})
            if point["state"] == "COMPLETE":
                run.tracker.log_metrics({trial["metric"]: point["value"]})
    if point["state"] == "PRUNED" and run.tracker.run_id:
        end_run(run.uri, run.tracker.run_id, "KILLED")  # it ended FINISHED; stopped early is what KILLED says
    return point


@functools.cache
def _storage(url: str):
    return st.open_storage(url)


def read_history(path: Path, metric: str) -> list[float]:
    """The per-epoch values of `metric` in a training stage's history.csv."""
    try:
        with open(path, newline="") as f:
            values = [float(row[metric]) for row in csv.DictReader(f)]
    except (OSError, KeyError, ValueError) as exc:
        raise DataError(f"{path}: no per-epoch {metric} to judge the trial by ({type(exc).__name__}: {exc})") from None
    if not values:
        raise DataError(f"{path}: no epochs recorded")
    return values


def end_run(uri: str | None, run_id: str, status: str) -> None:
    from trainlab.tracking.uri import mlflow_client

    if uri:
        mlflow_client(uri).set_terminated(run_id, status)


def mark_killed(uri: str | None):
    """The stale-trial hook: the MLflow runs of a trial killed with its search (its own and its stages' runs still
    open under it) end KILLED, tagged, instead of staying RUNNING; the workspace it left in this machine's temporary
    folder (pipelines.workspace.experiment_workspace names it trainlab-<experiment>-*) is removed."""
    def killed(trial) -> None:
        name = trial.user_attrs.get(st.EXPERIMENT_ATTR)
        for left in Path(tempfile.gettempdir()).glob(f"trainlab-{name}-*") if name else ():
            shutil.rmtree(left, ignore_errors=True)
        run_id = trial.user_attrs.get(st.RUN_ATTR)
        if not uri or not run_id:
            return
        from trainlab.tracking.uri import mlflow_client

        client = mlflow_client(uri)
        run = client.get_run(run_id)
        open_children = client.search_runs([run.info.experiment_id], filter_string=(
            f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'"))
        for stale in [run, *open_children]:
            client.set_tag(stale.info.run_id, PRUNED_TAG, "FAIL")
            client.set_tag(stale.info.run_id, "optuna_note", "killed with its search; the trial is run again")
            client.set_terminated(stale.info.run_id, "KILLED")
    return killed


class ReopenedRun:
    """The MLflow run of a study resumed after its search was killed: the same run, running again."""

    def __init__(self, uri: str, run_id: str) -> None:
        from trainlab.tracking.uri import mlflow_client

        self.client, self.run_id = mlflow_client(uri), run_id

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, data, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.client.log_metric(self.run_id, key, value)

    def set_tags(self, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))


@contextlib.contextmanager
def study_run(study, space: SearchSpace, repo: Path, name: str) -> Iterator[Any]:
    """The study's MLflow run: opened by its first search, reopened by a search that resumes it."""
    params = ov.validated_params(repo)
    uri = tracking_uri(repo, params)
    previous = study.user_attrs.get(st.RUN_ATTR)
    if uri and previous and _run_exists(uri, previous):
        run = ReopenedRun(uri, previous)
        run.client.update_run(previous, status="RUNNING")
        status = "FAILED"
        try:
            yield run
            status = "FINISHED"
        finally:
            run.client.set_terminated(previous, status)
        return
    tags = {**git_state(str(repo)), "optuna_study": name, "search_space": str(space.path)}
    with parent_run(params, repo, f"search {name}", "search", tags) as tracker:
        if tracker.run_id:
            study.set_user_attr(st.RUN_ATTR, tracker.run_id)
            tracker.log_params({"objective": f"{space.objective.direction} {space.objective.metric} of "
                                f"{space.objective.stage}", "pruner": json.dumps(space.pruner),
                                "sampler_seed": space.seed, "startup_trials": space.startup_trials})
            tracker.log_artifact(space.path)
        yield tracker


def _run_exists(uri: str, run_id: str) -> bool:
    from trainlab.tracking.uri import mlflow_client

    try:
        mlflow_client(uri).get_run(run_id)
        return True
    except Exception:  # noqa: BLE001 - a run deleted or a store reset: open a new one
        return False


def trial_spec(repo: Path, study, trial, space: SearchSpace) -> dict[str, Any]:
    """What the trial's training stage needs to report to it ($TRAINLAB_TRIAL)."""
    return {"storage": st.storage_url(repo), "study": study.study_name, "trial_id": trial._trial_id,
            "number": trial.number, "stage": space.objective.stage, "task": space.objective.task,
            "metric": space.objective.metric, "pruner": space.pruner}


def start_trial(runner, study, space: SearchSpace, repo: Path, stages: list[StageInfo], study_run_id: str | None,
                running: int) -> tuple[Any, Any, str]:
    """Ask the study for a trial and submit it as a Prefect task; (future, trial, experiment name)."""
    trial, overrides = st.ask(study, space, running)
    study._storage.record_heartbeat(trial._trial_id)
    name = f"{study.study_name}-{trial.number:03d}"
    trial.set_user_attr(st.EXPERIMENT_ATTR, name)
    try:
        check_experiment_name(repo, name)
    except ExperimentError as exc:  # an earlier study of this name left its experiments: every trial would clash
        st.tell(study, trial, exc)
        raise ExperimentError(f"{exc} (left by an earlier study named {study.study_name}? give --name)") from None
    future = runner.submit(run_trial, parameters={
        "root": str(repo), "name": name, "overrides": overrides, "stages": stages, "study_run_id": study_run_id,
        "targets": list(space.targets), "trial": trial_spec(repo, study, trial, space),
        "history": space.objective.history})
    print(f"trial {trial.number} ({name}) started: {ov.describe(overrides)}", flush=True)
    return future, trial, name


def run_trials(study, space: SearchSpace, repo: Path, stages: list[StageInfo], study_run_id: str | None,
               trials: int, parallel: int, heartbeat_s: int) -> None:
    """Keep `parallel` trials running until the study has `trials` finished ones; beat each running trial's heartbeat
    and tell the study each result as it comes."""
    from optuna.storages import fail_stale_trials

    running: dict[Any, tuple[Any, str]] = {}
    with ThreadPoolTaskRunner(max_workers=parallel) as runner:
        while True:
            fail_stale_trials(study)
            while len(running) < parallel and st.finished(study) + len(running) < trials:
                future, trial, name = start_trial(runner, study, space, repo, stages, study_run_id, len(running))
                running[future] = (trial, name)
            if not running:
                return
            done, _ = wait(list(running), timeout=heartbeat_s)
            for future in set(running) - set(done):
                study._storage.record_heartbeat(running[future][0]._trial_id)
            for future in done:
                trial, name = running.pop(future)
                future.wait()  # the final state with its result (`state` alone may be read back from the API)
                state = future.state
                result = state.result(raise_on_failure=False)
                if not state.is_completed() and not isinstance(result, BaseException):
                    result = RuntimeError(str(state.message))
                frozen = st.tell(study, trial, result)
                print(progress_line(study, space, frozen, name, trials), flush=True)


def plateau_record(info_file: Path) -> dict[str, Any]:
    """The training's plateau-schedule record (info.json "stopping"; empty for a run of a set number of epochs)."""
    try:
        return json.loads(info_file.read_text()).get("stopping") or {}
    except (OSError, ValueError):
        return {}


def progress_line(study, space: SearchSpace, frozen, name: str, trials: int) -> str:
    metric = space.objective.metric
    if frozen.state.name == "COMPLETE":
        what = f"{metric} {frozen.value:.4f}"
    elif frozen.state.name == "PRUNED":
        last = max(frozen.intermediate_values, default=None)
        what = f"pruned at epoch {last} ({metric} {frozen.intermediate_values[last]:.4f})" if last else "pruned"
    else:
        what = f"failed: {frozen.user_attrs.get(st.ERROR_ATTR, '')[:200]}"
    best = st.best(study)
    shown = f"; best {best['value']:.4f} ({best['experiment']})" if best else ""
    return f"[{st.finished(study)}/{trials}] trial {frozen.number} ({name}) {what}{shown}"


@flow(name="trainlab-search", log_prints=True)
def search(space: str, trials: int = DEFAULT_TRIALS, parallel: int = 1, name: str | None = None,
           root: str | None = None, heartbeat_s: int = DEFAULT_HEARTBEAT_S) -> dict[str, Any]:
    """Run (or resume) the study `name` (default: the space file's name) until it has `trials` finished trials,
    `parallel` at a time; then the summary, the best trial's experiment and the plots."""
    if trials < 1 or parallel < 1 or heartbeat_s < 1:
        raise ParamsError(f"trials ({trials}), parallel ({parallel}) and heartbeat ({heartbeat_s} s) must be 1 or more")
    started = time.perf_counter()
    repo = find_root(root)
    stages = read_stages(repo)
    spec = load_space(space, repo, stages)
    name = name or Path(space).stem
    uri = tracking_uri(repo, ov.validated_params(repo))
    study = st.open_study(repo, spec, name, heartbeat_s, on_killed=mark_killed(uri))
    for values in spec.enqueue:
        study.enqueue_trial(values, skip_if_exists=True)
    with study_run(study, spec, repo, name) as tracker:
        run_trials(study, spec, repo, stages, tracker.run_id or None, trials, parallel, heartbeat_s)
        summary = summarize(study, spec, repo, name, trials, parallel, time.perf_counter() - started)
        summary["mlflow_run_id"] = tracker.run_id or None
        record(summary, repo / REPORTS / name, study, tracker)
    if summary["best"] is None:
        raise UserError(f"study {name}: no trial completed; see the failures above and in {REPORTS / name}")
    return summary


def summarize(study, space: SearchSpace, repo: Path, name: str, trials: int, parallel: int,
              seconds: float) -> dict[str, Any]:
    rows = st.rows(study)
    counts = {s: sum(r["state"] == s for r in rows) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}
    return {"study": name, "storage": str(repo / st.STUDY_DB), "space": str(space.path),
            "objective": {"stage": space.objective.stage, "metric": space.objective.metric,
                          "direction": space.objective.direction},
            "pruner": space.pruner, "trials": trials, "parallel": parallel, "counts": counts,
            "seconds": round(seconds, 1), "best": st.best(study), "rows": rows}


def record(summary: dict[str, Any], folder: Path, study, tracker: Any) -> None:
    """summary.json and the plots in reports/search/<study>/, and the same on the study's MLflow run."""
    from trainlab.core.atomic import write_json

    plots, skipped = st.draw_plots(study, folder)
    summary["plots"] = [str(p) for p in plots]
    summary["plots_skipped"] = skipped
    write_json(folder / "summary.json", summary)
    if not getattr(tracker, "run_id", ""):
        return
    tracker.log_dict(summary, "search_summary.json")
    for path in plots:
        tracker.log_artifact(path, "plots")
    best = summary["best"]
    tracker.log_metrics({f"trials_{k.lower()}": float(v) for k, v in summary["counts"].items()} |
                        ({f"best_{summary['objective']['metric']}": float(best["value"])} if best else {}) |
                        {f"best_{k}": float(v) for k, v in (best or {}).get("test", {}).items()})
    if best:
        tracker.set_tags({"best_trial": str(best["number"]), "best_experiment": best["experiment"],
                          "best_trial_run_id": best["mlflow_run_id"] or ""})


def table(summary: dict[str, Any]) -> str:
    """One line per trial, then the best trial with its validation and test figures and how to apply it."""
    metric = summary["objective"]["metric"]
    lines = [f"{'trial':>5}  {'experiment':<24} {'state':<9} {metric:>12}  test  params"]
    for r in summary["rows"]:
        value = f"{r['value']:.4f}" if r["value"] is not None else (
            f"{r['last_value']:.4f}@{r['last_epoch']}" if r["last_value"] is not None else "-")
        test = ", ".join(f"{k}={v:.4f}" for k, v in r["test"].items()) or "-"
        lines.append(f"{r['number']:>5}  {r['experiment'] or '-':<24} {r['state']:<9} {value:>12}  {test}  "
                     f"{ov.describe(r['params'])}")
    best = summary["best"]
    if best:
        test = ", ".join(f"{k} {v:.4f}" for k, v in best["test"].items())
        lines.append(f"best: trial {best['number']} ({best['experiment']}): {metric} {best['value']:.4f}"
                     f"{', ' + test if test else ''}; apply it with `dvc exp apply {best['experiment']}`")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m pipelines.search", description=__doc__.split("\n\n")[0])
    parser.add_argument("space", help="the search space file (YAML), e.g. pipelines/spaces/classifier.yaml")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS,
                        help=f"finished trials the study should have (default {DEFAULT_TRIALS}); a resumed study "
                             "runs only the missing ones")
    parser.add_argument("--parallel", "-j", type=int, default=1,
                        help="trials at a time (default 1: the same study proposes the same trials)")
    parser.add_argument("--name", help="the study (default: the space file's name); run it again to resume it")
    parser.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT_S, metavar="SECONDS",
                        help=f"a trial not heard from for twice this long was killed (default {DEFAULT_HEARTBEAT_S})")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    repo = find_root()
    load_space(args.space, repo, read_stages(repo))  # one clear error for a bad space, before Prefect starts
    summary = search(space=args.space, trials=args.trials, parallel=args.parallel, name=args.name,
                     heartbeat_s=args.heartbeat)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return summary
    print(table(summary))
    print(f"plots and summary in {REPORTS / summary['study']}; trials in `dvc exp show` and in the MLflow UI "
          "(nested under the search run)")
    return summary


if __name__ == "__main__":
    run_cli(main)
