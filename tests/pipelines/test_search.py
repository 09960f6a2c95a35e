"""Real small studies on the tiny repo (real Optuna, Prefect, DVC experiments and MLflow): one end to end two at a
time, one killed mid-trial and resumed, one whose trial is pruned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.pipelines.conftest import dvc, git, stop_process_group, task_runs_by_name

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# Two epochs a trial (the tiny params stop after 2 optimizer steps; here every epoch runs).
SPACE = """\
objective: {stage: train_classifier, metric: val_accuracy}
sampler: {startup_trials: 2, seed: 7}
pruner: {kind: median, startup_trials: 1}
params:
  classifier.lr: {low: 1.0e-4, high: 1.0e-2, log: true}
  classifier.optimizer: {choices: [adamw, sgd]}
  classifier.label_smoothing: {low: 0.0, high: 0.2, when: {classifier.optimizer: adamw}}
fixed: {classifier.epochs: 2, classifier.max_steps: null}
"""


def write_space(folder: Path, text: str = SPACE) -> Path:
    path = folder / "space.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def experiments(repo: Path) -> dict[str, dict]:
    shown = json.loads(dvc(["exp", "show", "--json"], repo).stdout)
    return {e["name"]: e["data"] for b in shown for exp in (b.get("experiments") or []) for e in exp["revs"]}


def load_study(repo: Path, name: str):
    import optuna

    from trainlab.jobs.pruning import open_storage  # not at the same moment as a search creating the file

    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{repo / 'optuna.db'}"))


def mlflow_client(repo: Path):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")


def children(client, run) -> list:
    return client.search_runs([run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'")


def test_a_study_runs_trials_two_at_a_time_as_experiments_nested_runs_and_plots(first_pipeline_run, tiny_env,
                                                                                tmp_path, caplog):
    from pipelines.search import search, table

    params_before = (tiny_env / "params.yaml").read_text()
    summary = search(space=str(write_space(tmp_path)), trials=3, parallel=2, name="tiny", root=str(tiny_env))

    # Optuna: three finished trials in optuna.db, each trial's epochs reported by its training stage
    study = load_study(tiny_env, "tiny")
    trials = study.get_trials()
    assert [t.state.name for t in trials].count("COMPLETE") >= 2  # two start together: neither can be pruned
    assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"} and len(trials) == 3
    for t in trials:
        assert 1e-4 <= t.params["classifier.lr"] <= 1e-2
        assert ("classifier.label_smoothing" in t.params) == (t.params["classifier.optimizer"] == "adamw")
        if t.state.name == "COMPLETE":
            assert sorted(t.intermediate_values) == [1, 2] and t.value == t.intermediate_values[2]
    assert summary["counts"]["COMPLETE"] + summary["counts"]["PRUNED"] == 3

    # DVC: every complete trial is an experiment with its params; the best one is named and applicable
    exps = experiments(tiny_env)
    for t in trials:
        name = f"tiny-{t.number:03d}"
        assert (name in exps) == (t.state.name == "COMPLETE")
        if name in exps:
            data = exps[name]["params"]["params.yaml"]["data"]["classifier"]
            assert data["lr"] == pytest.approx(t.params["classifier.lr"]) and data["epochs"] == 2
    best = summary["best"]
    assert best["experiment"] in exps and best["value"] == study.best_value
    assert "test_accuracy" in best["test"]  # test figures beside the validation one
    assert f"dvc exp apply {best['experiment']}" in table(summary)

    # MLflow: the study's run holds the plots; one nested run per trial, its training run nested under it; overlap
    client = mlflow_client(tiny_env)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["best_experiment"] == best["experiment"]
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/optimization_history.png", "plots/parallel_coordinate.png",
            "plots/param_importances.png"} <= artifacts, artifacts
    assert (tiny_env / "reports" / "search" / "tiny" / "optimization_history.png").read_bytes()[:4] == b"\x89PNG"
    runs = children(client, parent)
    assert sorted(r.data.tags["dvc_experiment"] for r in runs) == ["tiny-000", "tiny-001", "tiny-002"]
    first_two = sorted(runs, key=lambda r: r.info.start_time)[:2]
    assert first_two[1].info.start_time < first_two[0].info.end_time  # two trials ran at once
    for run in runs:
        trained = children(client, run)
        assert len(trained) == 1 and trained[0].data.params["classifier.lr"] == run.data.params["classifier.lr"]
        assert run.data.tags["optuna_trial_state"] in ("COMPLETE", "PRUNED")

    assert "[3/3] trial" in caplog.text and "best" in caplog.text  # progress, one line a trial
    assert_applies(tiny_env, best, tmp_path / "clone")
    assert (tiny_env / "params.yaml").read_text() == params_before  # the workspace itself is untouched
    assert not git(["status", "--porcelain", "--", "optuna.db", "reports/search"], tiny_env).strip()  # ignored


def assert_applies(repo: Path, best: dict, clone: Path) -> None:
    """`dvc exp apply` of the best trial in a clone sharing the repo's DVC cache: its params, and its training stage
    up to date with the outputs DVC checked out."""
    git(["clone", "--quiet", str(repo), str(clone)], repo.parent)
    git(["fetch", "--quiet", "origin", "refs/exps/*:refs/exps/*"], clone)
    dvc(["config", "--local", "cache.dir", str(repo / ".dvc" / "cache")], clone)
    dvc(["exp", "apply", best["experiment"]], clone)
    applied = yaml.safe_load((clone / "params.yaml").read_text())["classifier"]
    assert applied["lr"] == pytest.approx(best["params"]["classifier.lr"]) and applied["epochs"] == 2
    assert (clone / "models" / "classifier" / "model.safetensors").is_file()
    assert "train_classifier" not in dvc(["status", "train_classifier"], clone).stdout


def test_a_killed_search_resumes_its_study_and_runs_the_killed_trial_again(first_pipeline_run, tiny_env, tmp_path):
    from pipelines import search_study as st
    from pipelines.search import search

    space = write_space(tmp_path, SPACE.replace("{kind: median, startup_trials: 1}", "{kind: none}"))  # all finish
    cmd = [sys.executable, "-m", "pipelines.search", str(space), "--trials", "2", "--name", "resume",
           "--heartbeat", "1"]
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=tiny_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYTHONPATH": str(tiny_env)})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # trial 0 has opened its MLflow run: its `dvc repro` is under way
            if proc.poll() is not None:
                pytest.fail(f"the search ended by itself ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if (tiny_env / "optuna.db").exists():
                trials = load_study(tiny_env, "resume").get_trials() if _has_study(tiny_env, "resume") else []
                if trials and st.RUN_ATTR in trials[0].user_attrs:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"trial 0 never started:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    finally:
        stop_process_group(proc, signal.SIGKILL)
    killed = load_study(tiny_env, "resume").get_trials()
    assert killed[0].state.name == "RUNNING", log.read_text()[-2000:]
    killed_run = killed[0].user_attrs[st.RUN_ATTR]

    time.sleep(3.5)  # past the grace period (2 heartbeats; SQLite keeps whole seconds)
    summary = search(space=str(space), trials=2, name="resume", root=str(tiny_env), heartbeat_s=1)

    trials = load_study(tiny_env, "resume").get_trials()
    states = [t.state.name for t in trials]
    assert states[0] == "FAIL" and states.count("COMPLETE") == 2 and "RUNNING" not in states, states
    again = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert len(again) == 1 and again[0].params == trials[0].params  # the killed trial ran again, same params
    assert summary["counts"] == {"COMPLETE": 2, "PRUNED": 0, "FAIL": 1, "RUNNING": 0, "WAITING": 0}
    assert not list(Path(tempfile.gettempdir()).glob("trainlab-resume-000-*"))  # the killed trial's workspace went

    client = mlflow_client(tiny_env)
    stale = client.get_run(killed_run)
    assert stale.info.status == "KILLED" and stale.data.tags["optuna_trial_state"] == "FAIL"
    assert all(r.info.status != "RUNNING" for r in children(client, stale))
    parent = client.get_run(summary["mlflow_run_id"])  # the killed search's run, reopened and finished
    assert parent.info.status == "FINISHED" and stale.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert len(children(client, parent)) == 3
    assert {f"resume-{t.number:03d}" for t in trials if t.state.name == "COMPLETE"} <= set(experiments(tiny_env))


def _has_study(repo: Path, name: str) -> bool:
    import optuna

    from trainlab.jobs.pruning import open_storage

    storage = open_storage(f"sqlite:///{repo / 'optuna.db'}")
    return name in [s.study_name for s in optuna.get_all_study_summaries(storage)]


def test_a_pruned_trial_stops_at_once_exit_9_recorded_pruned_nothing_cached_not_retried(first_pipeline_run,
                                                                                        tiny_env, tmp_path):
    from pipelines.search import search

    # any val_loss above 0.001 is pruned: the trial is stopped at its first epoch, deterministically
    space = write_space(tmp_path, SPACE.replace("objective: {stage: train_classifier, metric: val_accuracy}",
                                                "objective: {stage: train_classifier, metric: val_loss}")
                        .replace("pruner: {kind: median, startup_trials: 1}", "pruner: {kind: threshold, upper: 0.001}")
                        .replace("classifier.epochs: 2", "classifier.epochs: 3"))
    runs_cache = tiny_env / ".dvc" / "cache" / "runs"
    cached_runs = sorted(runs_cache.rglob("*")) if runs_cache.exists() else []
    state = search(space=str(space), trials=1, name="pruned", root=str(tiny_env), return_state=True)

    assert state.is_failed() and "no trial completed" in str(state.result(raise_on_failure=False))
    trial = load_study(tiny_env, "pruned").get_trials()[0]
    assert trial.state.name == "PRUNED" and list(trial.intermediate_values) == [1]  # stopped after epoch 1 of 3
    summary = json.loads((tiny_env / "reports" / "search" / "pruned" / "summary.json").read_text())
    assert summary["rows"][0]["state"] == "PRUNED" and summary["counts"]["PRUNED"] == 1

    # Prefect: the trial's task ran once (exit 9 is never retried) and completed with its result
    runs = task_runs_by_name(str(state.state_details.flow_run_id))
    assert runs["pruned-000"][0].run_count == 1 and runs["pruned-000"][0].state.is_completed()

    # MLflow: the trial's run KILLED and tagged PRUNED; its training run tagged, with epoch 1 only
    client = mlflow_client(tiny_env)
    trial_run = client.get_run(trial.user_attrs["mlflow_run_id"])
    assert trial_run.info.status == "KILLED" and trial_run.data.tags["optuna_trial_state"] == "PRUNED"
    (training,) = children(client, trial_run)
    assert training.data.tags["optuna_trial_state"] == "PRUNED" and training.data.tags["pruned_at_epoch"] == "1"
    (val_loss,) = client.get_metric_history(training.info.run_id, "val_loss")
    assert [(m.step, m.value) for m in client.get_metric_history(training.info.run_id, "epoch")] == \
        [(val_loss.step, 1.0)]  # one validation, at the end of epoch 1 (MLflow's step: the optimizer step)

    # DVC: no experiment and no run-cache entry for it (the stage failed, so nothing was committed)
    assert "pruned-000" not in experiments(tiny_env)
    assert (sorted(runs_cache.rglob("*")) if runs_cache.exists() else []) == cached_runs
