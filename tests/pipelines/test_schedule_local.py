"""`python -m pipelines.schedule` as the README gives it, with no PREFECT_API_URL: a local Prefect server it starts (or
reuses) schedules the runs; Ctrl+C / SIGTERM stop it quietly; a port it cannot use is one clear line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipelines.conftest import BIN, free_port, healthy, make_fake_repo, prefect_env, stop_process_group
from tests.pipelines.test_flow_behaviour import SEEDED_FILES

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SCHEDULED_RUN_TIMEOUT_S = 400  # the server's first start (a fresh DB) plus one interval plus the run itself
DEPLOYMENT = "trainlab-retrain/trainlab-retrain"


def schedule_env(home: Path, port: int) -> dict[str, str]:
    """The user's environment with no Prefect API configured; a private Prefect home; the server's port."""
    env = {**os.environ, **prefect_env(home), "PREFECT_SERVER_API_PORT": str(port),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PREFECT_API_URL", None)
    return env


def start_schedule(repo: Path, env: dict[str, str], log: Path, *args: str, sigint_ignored: bool = False
                ) -> subprocess.Popen:
    """`python -m pipelines.schedule ARGS` in its own process group; `sigint_ignored`: started as a script's `cmd &`
    starts it (SIGINT inherited ignored)."""
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "pipelines.schedule", *args], cwd=repo, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=ignore)


def wait_for(predicate, proc: subprocess.Popen, log: Path, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        assert proc.poll() is None, (f"the schedule command exited with {proc.returncode} before {what}:\n"
                                     f"{log.read_text()[-4000:]}")
        time.sleep(2)
    pytest.fail(f"no {what} within {timeout_s} s:\n{log.read_text()[-4000:]}")


def deployment_exists(api_url: str, name: str) -> bool:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
            client.read_deployment_by_name(name)
            return True
    except Exception:  # noqa: BLE001 - not registered yet
        return False


def completed_scheduled_runs(api_url: str) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name(DEPLOYMENT)
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
    except Exception:  # noqa: BLE001 - the server or the deployment is not up yet
        return []
    return [r for r in runs if r.state and r.state.is_completed() and r.auto_scheduled]


@pytest.mark.slow
def test_schedule_with_no_server_starts_one_whose_schedule_runs_the_job(tmp_path):
    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    port, log = free_port(), tmp_path / "schedule.log"
    api_url = f"http://127.0.0.1:{port}/api"
    proc = start_schedule(repo, schedule_env(tmp_path / "home", port), log, "--interval", "5")
    try:
        done = wait_for(lambda: completed_scheduled_runs(api_url), proc, log, SCHEDULED_RUN_TIMEOUT_S,
                        "completed scheduled run")
        proc.send_signal(signal.SIGTERM)  # the serving process only, as `kill PID` would
        returncode = proc.wait(timeout=180)  # a scheduled run already started finishes first
    finally:
        stop_process_group(proc)
    output = log.read_text()
    assert f"Prefect UI: http://127.0.0.1:{port}" in output
    assert done[0].deployment_id is not None
    assert (repo / "score.json").exists()  # the scheduled job ran the pipeline in the repo
    assert returncode == 0 and "Traceback" not in output, output[-4000:]
    assert "stopped serving trainlab-retrain" in output
    assert not healthy(api_url), "the server the schedule command started should stop with it"


def test_schedule_reuses_a_running_local_server_and_leaves_it_running(prefect_server, tmp_path):
    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    port = int(prefect_server.api_url.rsplit(":", 1)[1].split("/")[0])
    log = tmp_path / "schedule.log"
    # as a script's `python -m pipelines.schedule &` starts it: Ctrl+C / kill -INT still stop it
    proc = start_schedule(repo, schedule_env(prefect_server.home, port), log, "--interval", "3600", "--name", "reuse",
                          sigint_ignored=True)
    try:
        wait_for(lambda: "serving reuse" in log.read_text(), proc, log, 120, "serving line")
        wait_for(lambda: deployment_exists(prefect_server.api_url, "trainlab-retrain/reuse"), proc, log, 120,
                 "deployment registered by the runner")
        time.sleep(3)  # the runner polls from here on: Ctrl+C stops a serving process, not one still starting
        proc.send_signal(signal.SIGINT)  # Ctrl+C
        returncode = proc.wait(timeout=180)  # a scheduled run already started finishes first
    finally:
        stop_process_group(proc)
    output = log.read_text()
    assert "using the Prefect server already running" in output and "starting a local" not in output
    assert returncode == 0 and "Traceback" not in output, output[-4000:]
    assert healthy(prefect_server.api_url), "a server the schedule command did not start must keep running"


def test_schedule_refuses_at_once_when_the_port_is_not_a_prefect_server(tmp_path):
    repo = make_fake_repo(tmp_path / "repo", SEEDED_FILES)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "pipelines.schedule", "--interval", "5"], cwd=repo,
                              env=schedule_env(tmp_path / "home", port), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"port {port}" in errors[0] and "PREFECT_API_URL" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
