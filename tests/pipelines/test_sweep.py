"""A 3-point sweep with concurrency 2 on the tiny repo: 3 DVC experiments and 3 MLflow runs with distinct params."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.pipelines.conftest import BIN, dvc, stop_process_group

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

GRID = {"classifier.lr": [0.001, 0.002, 0.003], "classifier.weight_decay": [0.01]}  # more points than slots


def overlapping(intervals: list[tuple[int, int]]) -> bool:
    """Whether at least two (start, end) intervals overlap in time."""
    ordered = sorted(intervals)
    return any(later[0] < earlier[1] for earlier, later in zip(ordered, ordered[1:]))


def test_sweep_runs_points_two_at_a_time_as_experiments_and_mlflow_runs(first_pipeline_run, tiny_env):
    import mlflow

    from pipelines.sweep import sweep

    params_before = (tiny_env / "params.yaml").read_text()
    summary = sweep(grid=GRID, concurrency=2, name="grid", targets=["train_classifier"], root=str(tiny_env))

    assert summary["ok"] and [p["name"] for p in summary["points"]] == ["grid-01", "grid-02", "grid-03"]
    for point in summary["points"]:
        statuses = {s["stage"]: s["status"] for s in point["stages"]}
        assert statuses == {"prepare": "skipped", "train_classifier": "ran"}, statuses

    # every point is a DVC experiment with its own params
    shown = json.loads(dvc(["exp", "show", "--json"], tiny_env).stdout)
    exps = {e["name"]: e["data"] for b in shown for exp in (b.get("experiments") or []) for e in exp["revs"]}
    points = {n: exps[n]["params"]["params.yaml"]["data"]["classifier"] for n in ("grid-01", "grid-02", "grid-03")}
    assert {(p["lr"], p["weight_decay"]) for p in points.values()} == {(0.001, 0.01), (0.002, 0.01), (0.003, 0.01)}
    assert all("test_accuracy" in exps[n]["metrics"]["reports/classifier/metrics.json"]["data"] for n in points)

    # every point is an MLflow run with its params, its training run nested under it; two ran at once
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tiny_env / 'mlflow.db'}")
    runs = [client.get_run(p["mlflow_run_id"]) for p in summary["points"]]
    assert {(r.data.params["classifier.lr"], r.data.params["classifier.weight_decay"]) for r in runs} == {
        ("0.001", "0.01"), ("0.002", "0.01"), ("0.003", "0.01")}
    assert {r.data.params["dvc_experiment"] for r in runs} == set(points)
    assert overlapping([(r.info.start_time, r.info.end_time) for r in runs])
    trained = [client.search_runs([r.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{r.info.run_id}'")
               for r in runs]
    assert [len(t) for t in trained] == [1, 1, 1]
    assert len({t[0].data.params["classifier.lr"] + "/" + t[0].data.params["classifier.weight_decay"]
                for t in trained}) == 3

    # the workspace itself is untouched
    assert (tiny_env / "params.yaml").read_text() == params_before
    assert "up to date" in dvc(["status"], tiny_env).stdout


def test_sweep_points_run_on_a_work_pool_by_its_worker(first_pipeline_run, tiny_env, tmp_path):
    """`--deployment`: each point is a flow run of the deployed sweep_point flow, run by a process worker."""
    import mlflow
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from pipelines.sweep import POINT_FLOW_NAME, sweep

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PWD": str(tiny_env)}
    prefect = str(BIN / "prefect")

    def run(*args: str) -> None:
        proc = subprocess.run([prefect, *args], cwd=tiny_env, env=env, capture_output=True, text=True, timeout=180,
                              check=False)
        assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"

    run("work-pool", "create", "sweep-pool", "--type", "process")
    run("--no-prompt", "deploy", "--prefect-file", "pipelines/prefect.yaml", "--name", "sweep-point",
        "--pool", "sweep-pool")
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "sweep-pool", "--limit", "2"], cwd=tiny_env,
                                  env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    try:
        summary = sweep(grid={"classifier.lr": [0.004, 0.005]}, concurrency=2, name="pooled",
                        targets=["train_classifier"], root=str(tiny_env),
                        deployment=f"{POINT_FLOW_NAME}/sweep-point")
    finally:
        stop_process_group(worker)

    assert summary["ok"], f"{summary}\n{log.read_text()[-4000:]}"
    assert [p["name"] for p in summary["points"]] == ["pooled-01", "pooled-02"]
    for point in summary["points"]:
        assert {s["stage"]: s["status"] for s in point["stages"]}["train_classifier"] == "ran"

    # the worker ran them: two completed flow runs of the deployment, named after the points
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(f"{POINT_FLOW_NAME}/sweep-point")
        flow_runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
    assert deployment.work_pool_name == "sweep-pool"
    assert sorted(r.name for r in flow_runs if r.state.is_completed()) == ["pooled-01", "pooled-02"]

    shown = json.loads(dvc(["exp", "show", "--json"], tiny_env).stdout)
    exps = {e["name"]: e["data"] for b in shown for exp in (b.get("experiments") or []) for e in exp["revs"]}
    assert {exps[n]["params"]["params.yaml"]["data"]["classifier"]["lr"] for n in ("pooled-01", "pooled-02")} == {
        0.004, 0.005}

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tiny_env / 'mlflow.db'}")
    runs = [client.get_run(p["mlflow_run_id"]) for p in summary["points"]]
    assert {r.data.params["classifier.lr"] for r in runs} == {"0.004", "0.005"}
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {summary["mlflow_run_id"]}


def test_an_unknown_deployment_is_a_clear_error_before_any_point_runs(prefect_api, tiny_repo):
    from pipelines.sweep import sweep
    from trainlab.core.errors import ParamsError

    with pytest.raises(ParamsError, match="not on the Prefect server"):
        sweep(grid={"classifier.lr": [0.004]}, name="nowhere", root=str(tiny_repo),
              deployment="trainlab-sweep-point/missing")
    with pytest.raises(ParamsError, match="FLOW/DEPLOYMENT"):
        sweep(grid={"classifier.lr": [0.004]}, name="nowhere", root=str(tiny_repo), deployment="no-slash")
