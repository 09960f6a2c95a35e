"""Prefect's API server restarted while `python -m pipelines.flow` runs a stage: the stage finishes, the flow carries
on (or fails in one line), and a second flow run skips what DVC already has. A stage that exits 6 (MLflow server
unreachable) is not retried while that server is still down."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.processes import BIN, PYTHON, MlflowServer, run_env
from tests.pipelines.conftest import (
    SERVER_STARTUP_TIMEOUT_S,
    free_port,
    healthy,
    make_fake_repo,
    prefect_env,
    stop_process_group,
)
from tests.reliability.factories import wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.integration, pytest.mark.slow]


class RestartablePrefect:
    """`prefect server start` on a fixed port and home (its SQLite DB), stopped and started again by the test."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.home / f"server-{self.starts}.log"
        env = run_env(**prefect_env(self.home))
        with open(log, "w") as out:
            self.proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                                          str(self.port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
        while not healthy(self.api_url):
            assert self.proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"prefect server not healthy after {SERVER_STARTUP_TIMEOUT_S} s"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, signal.SIGKILL)
            self.proc = None


@pytest.fixture
def prefect(tmp_path):
    server = RestartablePrefect(tmp_path / "prefect-home")
    server.home.mkdir()
    server.start()
    yield server
    server.stop()


STAGES = {
    "slow.py": """
        import pathlib, time
        runs = pathlib.Path("../runs-slow")
        runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))
        pathlib.Path("../slow-started").write_text("")
        while not pathlib.Path("../slow-release").exists():
            time.sleep(0.2)
        pathlib.Path("out").mkdir(exist_ok=True)
        pathlib.Path("out/slow.txt").write_text("done")
    """,
    "after.py": """
        import pathlib
        pathlib.Path("out/after.txt").write_text(pathlib.Path("out/slow.txt").read_text() + " and after")
    """,
    "dvc.yaml": """
        stages:
          slow:
            cmd: python slow.py
            deps: [slow.py]
            outs: [out/slow.txt]
          after:
            cmd: python after.py
            deps: [after.py, out/slow.txt]
            outs: [out/after.txt]
    """,
}


def flow_command(repo: Path, api_url: str, log: Path, *args: str) -> subprocess.Popen:
    env = run_env(**prefect_env(repo.parent / "client-home", api_url))
    with open(log, "w") as out:
        return subprocess.Popen([PYTHON, "-m", "pipelines.flow", "--retry-delay", "1", "--json", *args], cwd=repo,
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def summary_of(output: str) -> dict:
    start = output.rindex("\n{\n") + 1 if "\n{\n" in output else output.index("{\n")
    return json.loads(output[start:output.rindex("}") + 1])


def test_prefect_server_restarted_while_a_stage_runs(tmp_path, prefect):
    repo = make_fake_repo(tmp_path / "repo", STAGES)
    log = tmp_path / "flow-1.log"
    proc = flow_command(repo, prefect.api_url, log)
    try:
        wait_until(lambda: (tmp_path / "slow-started").exists(), proc, log, timeout=300, what="the stage started")
        prefect.stop()
        (tmp_path / "slow-release").write_text("")  # the stage ends while the API is down
        time.sleep(3)
        prefect.start()
        proc.wait(timeout=600)
    finally:
        stop_process_group(proc, signal.SIGKILL)
    output = log.read_text()
    assert (repo / "out/slow.txt").read_text() == "done"  # the running stage finished
    assert (tmp_path / "runs-slow").read_text() == "1"
    if proc.returncode == 0:  # the flow carried on
        assert (repo / "out/after.txt").read_text() == "done and after"
        assert [s["status"] for s in summary_of(output)["stages"]] == ["ran", "ran"]
    else:  # or failed in one line
        ending = output.rstrip().splitlines()[-2:]
        assert ending[0].startswith("error: ") and ending[1].startswith("(set TRAINLAB_DEBUG=1"), output[-3000:]

    second = tmp_path / "flow-2.log"
    proc = flow_command(repo, prefect.api_url, second)
    try:
        proc.wait(timeout=600)
    finally:
        stop_process_group(proc, signal.SIGKILL)
    output = second.read_text()
    assert proc.returncode == 0, output[-3000:]
    statuses = {s["stage"]: s["status"] for s in summary_of(output)["stages"]}
    assert statuses["slow"] == "skipped"  # DVC has it: not run again
    assert (tmp_path / "runs-slow").read_text() == "1"
    assert (repo / "out/after.txt").read_text() == "done and after"


def test_a_stage_that_exits_6_is_not_retried_while_the_tracking_server_is_down(tmp_path, prefect):
    (tmp_path / "mlflow").mkdir()
    mlflow_server = MlflowServer(tmp_path / "mlflow", free_port())
    mlflow_server.start()
    repo = make_fake_repo(tmp_path / "repo", {
        "track.py": """
            import pathlib, time
            runs = pathlib.Path("../runs-track")
            runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))
            pathlib.Path("../track-started").write_text("")
            while not pathlib.Path("../track-release").exists():
                time.sleep(0.2)
            from trainlab.core.cli import run_cli
            from trainlab.core.config import load_params
            from trainlab.tracking.uri import probe_tracking
            run_cli(lambda argv: probe_tracking(load_params("params.yaml")), [])
        """,
        "dvc.yaml": """
            stages:
              track:
                cmd: python track.py
                deps: [track.py]
                outs: [out/track.txt]
        """})
    (repo / "params.yaml").write_text(f"base:\n  seed: 1\ntracking:\n  enabled: true\n  uri: {mlflow_server.uri}\n"
                                      "  connect_timeout_s: 1\n  request_timeout_s: 15\n  request_retries: 0\n")
    log = tmp_path / "flow.log"
    proc = flow_command(repo, prefect.api_url, log, "--retries", "2")
    try:
        wait_until(lambda: (tmp_path / "track-started").exists(), proc, log, timeout=300, what="the stage started")
        mlflow_server.stop()  # the flow's parent run is open; the server goes away for good
        (tmp_path / "track-release").write_text("")
        proc.wait(timeout=600)
    finally:
        stop_process_group(proc, signal.SIGKILL)
        mlflow_server.stop()
    output = log.read_text()
    assert proc.returncode == 6, output[-3000:]
    assert (tmp_path / "runs-track").read_text() == "1"  # not retried: the server is still down
    # Prefect's own log of the failed task run has its traceback; what the command ends with is one line
    ending = output[output.rindex("Finished in state Failed"):].splitlines()[1:]
    assert len(ending) == 2 and ending[1].startswith("(set TRAINLAB_DEBUG=1"), output[-3000:]
    assert ending[0].startswith("error: stage track failed (MLflow server unreachable, exit 6; not retried while it is "
                                "down): MLflow tracking server http://127.0.0.1:")
