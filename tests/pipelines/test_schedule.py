"""Scheduled retraining against a real `prefect server start`: served on an interval, deployed to a process pool."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.pipelines.conftest import BIN, REPO, make_fake_repo, stop_process_group
from tests.pipelines.test_flow_behaviour import SEEDED_FILES

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SCHEDULED_RUN_TIMEOUT_S = 300
TASKS = ("classifier", "segmenter", "text")


def deployment_runs(name: str) -> tuple[object, list]:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(name)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
    return deployment, runs


def wait_for_completed_run(name: str, proc: subprocess.Popen, log, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the schedule command exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
        try:
            _, runs = deployment_runs(name)
        except Exception:  # noqa: BLE001 - the deployment is not registered yet
            runs = []
        failed = [r for r in runs if r.state and r.state.is_failed()]
        assert not failed, f"a scheduled run failed: {failed[0].state.message}\n{log.read_text()[-4000:]}"
        done = [r for r in runs if r.state and r.state.is_completed()]
        if done:
            return done
        time.sleep(3)
    pytest.fail(f"no scheduled run completed within {timeout_s} s:\n{log.read_text()[-4000:]}")


@pytest.mark.slow
def test_served_flow_runs_on_its_schedule_and_promotes_champions(first_pipeline_run, tiny_env, tmp_path):
    import mlflow

    from pipelines.compare import CHAMPION, model_name

    log = tmp_path / "schedule.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines.schedule", "--interval", "5", "--name", "every-5s"],
                                cwd=tiny_env, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        done = wait_for_completed_run("trainlab-retrain/every-5s", proc, log, SCHEDULED_RUN_TIMEOUT_S)
    finally:
        # like Ctrl+C: the runner pauses the schedule as it stops, after the run it may have started meanwhile
        stop_process_group(proc, signal.SIGINT, timeout=240)

    assert done[0].deployment_id is not None and done[0].auto_scheduled
    deployment, _ = deployment_runs("trainlab-retrain/every-5s")
    assert deployment.paused, "stopping the schedule command should pause the schedule"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tiny_env / 'mlflow.db'}")
    for task in TASKS:  # the first registered versions were crowned; the job keeps or beats them
        assert client.get_model_version_by_alias(model_name(task), CHAMPION).version


@pytest.mark.slow
def test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_job(prefect_api, tmp_path):
    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    shutil.copytree(REPO / "pipelines", repo / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PWD": str(repo)}
    prefect = str(BIN / "prefect")

    def run(*args: str) -> str:
        proc = subprocess.run([prefect, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    run("work-pool", "create", "trainlab-process", "--type", "process")
    run("--no-prompt", "deploy", "--prefect-file", "pipelines/prefect.yaml", "--name", "trainlab-retrain", "--cron",
        "0 3 * * *", "--timezone", "Europe/Berlin")
    run("deployment", "run", "trainlab-retrain/trainlab-retrain")
    run("worker", "start", "--pool", "trainlab-process", "--run-once")

    deployment, runs = deployment_runs("trainlab-retrain/trainlab-retrain")
    assert deployment.work_pool_name == "trainlab-process"
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [("0 3 * * *", "Europe/Berlin")]
    completed = [r for r in runs if r.state.is_completed()]
    assert len(completed) == 1 and not completed[0].auto_scheduled  # the run we asked for; the cron's are later
    assert (repo / "score.json").exists()  # the worker ran the pipeline in the repo


def test_python_deploy_takes_the_cron_from_params(prefect_api, tmp_path):
    from pipelines.schedule import deploy, schedule_for

    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    shutil.copytree(REPO / "pipelines", repo / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    deploy(repo, schedule_for(repo, None, None, None), pool="python-pool", name="from-python")

    deployment, _ = deployment_runs("trainlab-retrain/from-python")
    assert deployment.work_pool_name == "python-pool" and deployment.parameters == {"root": str(repo)}
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [("0 3 * * *", "UTC")]
