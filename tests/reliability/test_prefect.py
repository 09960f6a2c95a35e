"""Prefect: a stage that fails transiently (killed by a signal) is retried, one that fails on bad params or data is
not; two sweep tasks logging at once to the SQLite MLflow store lose no run, param or metric. Against a real
Prefect server on 127.0.0.1, on tiny Git + DVC repos whose stages call trainlab (no torch)."""

from __future__ import annotations

import pytest

from tests.pipelines.conftest import make_fake_repo, task_runs_by_name

pytestmark = [pytest.mark.reliability, pytest.mark.integration,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]



@pytest.fixture(autouse=True)
def no_logs_to_the_api(prefect_api):
    """Flow and task logs stay local: otherwise, after the session's server stops, Prefect's exit-time flush of
    queued logs keeps retrying a dead API for a minute or more."""
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: False}):
        yield


COUNT_ATTEMPT = """
    import pathlib
    counter = pathlib.Path("../attempts-{name}")
    attempt = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(attempt))
"""
RETRY_FILES = {
    # killed by SIGKILL the first time (as the OOM killer or `kill -9` would), then succeeds
    "killed.py": COUNT_ATTEMPT.format(name="killed") + """
    import os, signal
    if attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    pathlib.Path("out").mkdir(exist_ok=True)
    pathlib.Path("out/killed.txt").write_text("ok")
    """,
    # trainlab's own params validation: ParamsError, exit 2
    "bad_params.py": COUNT_ATTEMPT.format(name="bad_params") + """
    from trainlab.core.cli import run_cli
    from trainlab.core.config import load_params
    run_cli(lambda argv: load_params("bad_params.yaml"), [])
    """,
    "bad_params.yaml": "classifier:\n  lrr: 0.1\n",
    # bad data as trainlab reports it: DataError, exit 3
    "bad_data.py": COUNT_ATTEMPT.format(name="bad_data") + """
    from trainlab.core.cli import run_cli
    from trainlab.core.errors import DataError
    def main(argv):
        raise DataError("data/raw/texts.csv: row 3: empty text")
    run_cli(main, [])
    """,
    "dvc.yaml": """
    stages:
      killed:
        cmd: python killed.py
        deps: [killed.py]
        outs: [out/killed.txt]
      bad_params:
        cmd: python bad_params.py
        deps: [bad_params.py, bad_params.yaml]
        outs: [out/bad_params.txt]
      bad_data:
        cmd: python bad_data.py
        deps: [bad_data.py]
        outs: [out/bad_data.txt]
    """,
}


def test_transient_failure_is_retried_bad_params_or_data_are_not(prefect_api, tmp_path):
    from pipelines.execute import PermanentStageError
    from pipelines.flow import pipeline, run_stage

    assert run_stage.retries >= 1 and run_stage.retry_condition_fn is not None
    repo = make_fake_repo(tmp_path / "repo", RETRY_FILES)
    state = pipeline(root=str(repo), retries=2, retry_delay_s=0.1, return_state=True)

    assert state.is_failed()
    attempts = {name: int((tmp_path / f"attempts-{name}").read_text()) for name in ("killed", "bad_params", "bad_data")}
    assert attempts == {"killed": 2, "bad_params": 1, "bad_data": 1}
    runs = task_runs_by_name(str(state.state_details.flow_run_id))
    assert runs["killed"][0].state.is_completed() and runs["killed"][0].run_count == 2
    for name in ("bad_params", "bad_data"):
        run = runs[name][0]
        assert run.state.is_failed() and run.run_count == 1, name
    error = state.result(raise_on_failure=False)  # the first failure in DVC's stage order
    assert isinstance(error, PermanentStageError) and error.exit_code in (2, 3) and "not retried" in str(error)
    assert "classifier.lrr" in str(error) or "data/raw/texts.csv: row 3: empty text" in str(error)


LOGGING_STAGE = """
    import json
    from trainlab.core.config import load_params
    from trainlab.tracking.runs import start_run

    params = load_params("params.yaml")
    seed = params.base.seed
    with start_run(params, stage="log_stage") as tracker:
        tracker.log_params({"point": {f"p{i:02d}": seed * 100 + i for i in range(N_PARAMS)}})
        for step in range(1, N_STEPS + 1):
            tracker.log_metrics({f"m{k}": seed + step / 100 + k for k in range(N_METRICS)}, step=step)
        tracker.set_tags({"seed": seed})
    json.dump({"test_score": seed / 10}, open("score.json", "w"))
"""
N_PARAMS, N_METRICS, N_STEPS = 60, 8, 25


def test_two_sweep_tasks_at_once_lose_no_run_param_or_metric(prefect_api, tmp_path, monkeypatch):
    import mlflow

    from pipelines.sweep import sweep

    stage = LOGGING_STAGE.replace("N_PARAMS", str(N_PARAMS)).replace("N_METRICS", str(N_METRICS)) \
        .replace("N_STEPS", str(N_STEPS))
    repo = make_fake_repo(tmp_path / "repo", {
        "log_stage.py": stage,
        "dvc.yaml": """
            stages:
              log_stage:
                cmd: python log_stage.py
                deps: [log_stage.py]
                params: [base.seed]
                metrics:
                  - score.json:
                      cache: false
        """})
    (repo / "params.yaml").write_text("base:\n  seed: 1\ntracking:\n  enabled: true\n")
    from tests.reliability.factories import git
    git(["commit", "--quiet", "-am", "tracking on"], repo)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    summary = sweep(grid={"base.seed": [3, 4]}, concurrency=2, name="rel", root=str(repo))
    assert summary["ok"], summary

    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")  # the repo's default store
    experiment = client.get_experiment_by_name("trainlab")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    by_stage: dict[str, list] = {}
    for run in runs:
        by_stage.setdefault(run.data.tags.get("stage"), []).append(run)
    assert {k: len(v) for k, v in by_stage.items()} == {"sweep": 1, "experiment": 2, "log_stage": 2}
    assert all(r.info.status == "FINISHED" for r in runs)
    points = by_stage["experiment"]
    spans = sorted((r.info.start_time, r.info.end_time) for r in points)
    assert spans[1][0] < spans[0][1], "the two sweep tasks did not run at once"
    for run in by_stage["log_stage"]:
        seed = int(run.data.tags["seed"])
        assert run.data.tags["mlflow.parentRunId"] in {p.info.run_id for p in points}
        assert {k: v for k, v in run.data.params.items() if k.startswith("point.")} == {
            f"point.p{i:02d}": str(seed * 100 + i) for i in range(N_PARAMS)}
        for k in range(N_METRICS):
            history = client.get_metric_history(run.info.run_id, f"m{k}")
            assert sorted(m.step for m in history) == list(range(1, N_STEPS + 1))
    assert sorted(int(r.data.tags["seed"]) for r in by_stage["log_stage"]) == [3, 4]
