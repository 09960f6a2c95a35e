"""Fixtures for the pipeline tests: a real Prefect server on 127.0.0.1, a tiny copy of this repo, fake DVC repos."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from benchmarks.processes import free_port, healthy  # noqa: F401 - free_port: the pipeline tests' import
from benchmarks.tiny import TINY_PARAMS
from pipelines.overrides import deep_merge
from pipelines.workspace import copy_worktree

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVER_STARTUP_TIMEOUT_S = 240   # the first start migrates a fresh SQLite DB; slow on a busy 2-core machine
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@localhost",
                "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@localhost"}

@dataclass
class PrefectServer:
    api_url: str
    home: Path
    log: Path


def stop_process_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Stop a process started with start_new_session=True, and its children, by its own group id."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def prefect_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    env = {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_UI_ENABLED": "false", "DVC_NO_ANALYTICS": "1", "PREFECT_LOGGING_LEVEL": "INFO",
           # schedule quickly so a served flow's first run comes within seconds
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
           "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "2",
           "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


# --- repositories ----------------------------------------------------------------------------------------------------

def git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_IDENTITY}).stdout


def dvc(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=cwd, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"dvc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def commit_all(root: Path, message: str = "test repo") -> None:
    git(["add", "-A"], root)
    git(["commit", "--quiet", "--no-verify", "-m", message], root)


def task_runs_by_name(flow_run_id: str) -> dict[str, list]:
    """The task runs of a flow run, grouped by task run name (retries of one task share its name)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    found: dict[str, list] = {}
    for run in runs:
        found.setdefault(run.name, []).append(run)
    return found


def make_tiny_repo(dst: Path) -> Path:
    """A copy of this repo (its own git history of one commit) on tiny user data and tiny params."""
    from tests.data.factories import make_user_data, user_data_section

    copy_worktree(REPO, dst)
    data = make_user_data(dst / "data" / "raw" / "user")
    params = yaml.safe_load((dst / "params.yaml").read_text())
    section = user_data_section(data.relative_to(dst))
    deep_merge(params, {"data": section, **TINY_PARAMS})
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for leftover in ("dvc.lock", "mlflow.db"):
        (dst / leftover).unlink(missing_ok=True)
    git(["init", "--quiet"], dst)
    commit_all(dst)
    return dst


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory) -> Path:
    """The tiny repo shared by the whole-pipeline tests (they build on each other's DVC and MLflow state)."""
    return make_tiny_repo(tmp_path_factory.mktemp("tiny") / "repo")


@pytest.fixture(scope="session")
def tiny_env(tiny_repo, prefect_api):
    """MLflow in the tiny repo's own SQLite store, for this process and every stage it starts."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tiny_repo / 'mlflow.db'}")
        yield tiny_repo


@pytest.fixture(scope="session")
def first_pipeline_run(tiny_env):
    """The pipeline flow run once on the fresh tiny repo (every stage runs)."""
    from pipelines.flow import pipeline

    started = time.perf_counter()
    summary = pipeline(root=str(tiny_env), retries=0)
    return summary, time.perf_counter() - started


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())


def make_fake_repo(root: Path, files: dict[str, str]) -> Path:
    """A Git + DVC repo of tiny Python stages (no torch): for retries, failures, skips and experiments."""
    root.mkdir(parents=True)
    git(["init", "--quiet"], root)
    dvc(["init", "--quiet"], root)
    write_files(root, {"params.yaml": "base:\n  seed: 1  # kept comment\ntracking:\n  enabled: false\n", **files})
    commit_all(root)
    return root
