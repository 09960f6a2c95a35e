"""Shared fixtures: the repo's params, tiny configs, a temporary MLflow store; markers for gpu tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# scripts/test runs two pytest-xdist workers on two cores: each worker, and every process it starts, computes on one
# thread, so that two busy workers do not oversubscribe the cores (OpenMP threads spinning against each other made
# torch-heavy tests several times slower).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    torch.set_num_threads(1)


# Test files that share an expensive session fixture are one work unit for pytest-xdist, so that one worker builds
# it once instead of each worker once: the tiny pipeline's run (tests/pipelines/conftest.py: first_pipeline_run, a
# minute of stages after a Prefect server's start) and the four tracked trainings (tests/reliability/conftest.py:
# tracked_runs, four training processes at once).
SHARED_FIXTURE_FILES = {
    "first_pipeline_run": tuple(f"tests/pipelines/{name}.py" for name in
                                ("test_pipeline", "test_readme_model", "test_reproducible", "test_schedule",
                                 "test_search", "test_sweep")),
    "tracked_runs": ("tests/reliability/test_security.py", "tests/reliability/test_tracking.py"),
}


def work_unit(nodeid: str) -> str:
    """The unit `--dist loadfile` hands a worker whole: the test's file, or the files sharing a session fixture."""
    path = nodeid.split("::", 1)[0]
    return next((f"shared {fixture}" for fixture, files in SHARED_FIXTURE_FILES.items() if path in files), path)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedRunScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    # The whole-pipeline-twice test runs only when a -m expression names it: a user's `-m reliability` replaces
    # any default -m, so the default cannot live in addopts.
    if "full_pipeline" not in (config.getoption("markexpr") or ""):
        kept = [item for item in items if "full_pipeline" not in item.keywords]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if "full_pipeline" in item.keywords])
            items[:] = kept
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def repo_params():
    from trainlab.core.config import load_params

    return load_params(REPO / "params.yaml")


@pytest.fixture
def tmp_mlflow(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store in tmp_path, used through MLFLOW_TRACKING_URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


# One Prefect server for the whole session (tests/pipelines and tests/reliability share it): Prefect's event
# client is process-wide, so a second server started later in the same process would not receive its events.
from tests.pipelines.conftest import (  # noqa: E402
    BIN,
    SERVER_STARTUP_TIMEOUT_S,
    PrefectServer,
    free_port,
    healthy,
    prefect_env,
    stop_process_group,
)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """`prefect server start` on a free 127.0.0.1 port for the whole session; stopped at the end."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = home / "server.log"
    env = {**os.environ, **prefect_env(home)}
    env.pop("PREFECT_API_URL", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
        while not healthy(api_url):
            if proc.poll() is not None:
                pytest.fail(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"prefect server not healthy after {SERVER_STARTUP_TIMEOUT_S} s:\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(1)
        yield PrefectServer(api_url, home, log)
    finally:
        stop_process_group(proc, signal.SIGTERM)
    assert proc.poll() is not None, "the Prefect server started by the tests is still running"


@pytest.fixture(scope="session")
def prefect_api(prefect_server):
    """Point this process (settings) and its subprocesses (environment) at the test server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with pytest.MonkeyPatch.context() as mp:
        for key, value in prefect_env(prefect_server.home, prefect_server.api_url).items():
            mp.setenv(key, value)
        with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url, PREFECT_HOME: prefect_server.home}):
            yield prefect_server
