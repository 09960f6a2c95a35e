"""Fixtures for the scale-out tests: tiny prepared data, a migrated MLflow DB, a real `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from benchmarks.processes import NO_JOBS, healthy
from pipelines.overrides import deep_merge
from tests.data.factories import make_image_folder, make_paired_folders, make_text_csv, user_data_section
from tests.pipelines.conftest import free_port, stop_process_group

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MLFLOW_STARTUP_TIMEOUT_S = 120  # a first start is ~30 s on a busy 2-core machine
STAGE_TIMEOUT_S = 300
TIMINGS: dict[str, float] = {}  # wall seconds of the expensive steps, shown at the end of the run

# Tiny, deterministic, single-threaded training: fp32 on the CPU so that 1 and 2 processes agree to 1e-5.
TINY = {
    "base": {"seed": 5, "device": "cpu", "precision": "fp32", "num_workers": 0},
    "classifier": {"width": 8, "epochs": 1, "min_steps": None, "batch_size": 4, "warmup_epochs": 0},
    # SGD, not AdamW: the attention's key bias has a zero gradient in exact arithmetic (softmax ignores a shift), so
    # AdamW's m/sqrt(v) turns rounding noise there into lr-sized steps that differ between 1 and 2 processes
    # (measured: 1.5e-3 on those 8 values, every other weight within 1.5e-7); SGD keeps the noise at its size.
    "text": {"arch": "transformer", "d_model": 8, "n_heads": 2, "n_layers": 1, "dim_feedforward": 8, "dropout": 0.0,
             "epochs": 2, "min_steps": None, "batch_size": 8, "optimizer": "sgd", "lr": 0.1, "warmup_epochs": 0,
             "baseline_max_features": 50},
    "tracking": {"enabled": True},
}


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.write_sep("-", "scale-out timings (wall seconds)")
        for what, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f}")


class timed:
    """`with timed("what"):` records the block's wall seconds in TIMINGS."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        TIMINGS[self.what] = time.perf_counter() - self.started


def tiny_params(extra: dict | None = None) -> dict:
    """TINY (deep-copied) with `extra` merged in."""
    return deep_merge(yaml.safe_load(yaml.safe_dump(TINY)), extra or {})


def write_params(path: Path, params: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def stage_env(**extra: str) -> dict[str, str]:
    """The environment of a stage subprocess: this repo importable, one thread, offline, no inherited nesting."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1", "TRAINLAB_DEBUG": "1",
           "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("TRAINLAB_PARENT_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "LOCAL_RANK", "RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env.update(extra)
    return env


def run_stage(module: str, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` in `cwd`; asserts exit 0 and shows the end of its output otherwise."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=stage_env(**env), capture_output=True,
                          text=True, timeout=STAGE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{module} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def files_under(root: Path) -> list[str]:
    """Every file below `root`, relative and sorted (what a stage left behind)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# --- data and stores -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """Tiny user data (60 short texts, 15 images, 8 masks) prepared once in-process: <root>/data/prepared/<task>,
    and the text baseline the text training reads: <root>/models/text_baseline/baseline.json."""
    from stages import text_baseline
    from stages.prepare import main

    root = tmp_path_factory.mktemp("prepared")
    raw = root / "raw"
    make_image_folder(raw / "classes")
    make_paired_folders(raw / "seg")
    make_text_csv(raw / "texts.csv", per_class=20)  # 42 training texts: 5 global batches of 8 per epoch
    params = write_params(root / "params.yaml", tiny_params({"data": user_data_section(raw),
                                                             "tracking": {"enabled": False}}))
    with timed("prepare (in-process)"):
        main([str(root / "data" / "prepared"), str(root / "reports" / "data_stats.json"), "--params", str(params)])
        text_baseline.main([str(root / "data" / "prepared" / "text"), str(root / "models" / "text_baseline"),
                            "--params", str(params)])
    return root


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    """An empty, migrated MLflow SQLite DB made once (its alembic migrations take seconds); tests copy it."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    with timed("migrate an empty MLflow DB"):
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def sqlite_store(folder: Path, migrated_db: Path) -> str:
    """A fresh MLflow store in `folder` (a copy of the migrated template); its tracking URI."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_db, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


@dataclass
class MlflowServer:
    uri: str
    root: Path
    artifacts: Path
    log: Path



@pytest.fixture
def mlflow_server(tmp_path_factory, migrated_db):
    """`mlflow server` on a free 127.0.0.1 port: SQLite backend, artifacts proxied to a local folder; stopped after."""
    root = tmp_path_factory.mktemp("mlflow_server")
    shutil.copyfile(migrated_db, root / "server.db")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    env = stage_env(**NO_JOBS)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        started, deadline = time.perf_counter(), time.monotonic() + MLFLOW_STARTUP_TIMEOUT_S
        while not healthy(uri):
            if proc.poll() is not None:
                pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy after {MLFLOW_STARTUP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        TIMINGS["mlflow server startup"] = time.perf_counter() - started
        yield MlflowServer(uri, root, root / "artifacts", log)
    finally:
        # uvicorn waits for idle keep-alive connections (this process's MLflow client) before it exits: 5 s, then kill
        stop_process_group(proc, signal.SIGTERM, timeout=5)
    assert proc.poll() is not None, "the mlflow server started by the test is still running"
