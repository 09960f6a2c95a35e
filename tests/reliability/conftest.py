"""Fixtures for the reliability tests: real prepared data made once, an uninterrupted reference training run."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

# a real Prefect server on 127.0.0.1 for the session (started only when a Prefect test asks for it)
from tests.reliability.factories import (
    CLASSIFIER_ARGS,
    run_stage,
    tiny_params,
    write_params,
)

TIMINGS: dict[str, float] = {}  # wall seconds of the expensive steps, shown at the end of the run


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.write_sep("-", "reliability timings (wall seconds)")
        for what, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f}")


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """A folder with data/prepared (the embedded data, made small) and reports/data_stats.json, made in-process."""
    from stages.prepare import main

    root = tmp_path_factory.mktemp("prepared")
    params = write_params(root / "params.yaml", tiny_params())
    started = time.perf_counter()
    main([str(root / "data" / "prepared"), str(root / "reports" / "data_stats.json"), "--params", str(params)])
    TIMINGS["prepare"] = time.perf_counter() - started
    return root


def make_workspace(root: Path, prepared_root: Path, params: dict, tasks: tuple[str, ...] = ("classification",)) -> Path:
    """A stage's working folder: params.yaml and a copy of the prepared data of `tasks` (nothing else)."""
    root.mkdir(parents=True, exist_ok=True)
    write_params(root / "params.yaml", params)
    for task in tasks:
        shutil.copytree(prepared_root / "data" / "prepared" / task, root / "data" / "prepared" / task)
    return root


@pytest.fixture(scope="session")
def reference(tmp_path_factory, prepared) -> Path:
    """The classifier trained once without interruption (a subprocess, deterministic, one thread): what every
    interrupted-and-resumed run must end bitwise-equal to."""
    root = make_workspace(tmp_path_factory.mktemp("reference"), prepared, tiny_params())
    started = time.perf_counter()
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root)
    TIMINGS["reference_run"] = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (root / "checkpoints" / "classifier" / "last.pt").exists()
    return root


# --- four training processes logging at once to the default SQLite store ------------------------------------------

SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-SECRET-do-not-log-7f3a",
           "MLFLOW_TRACKING_PASSWORD": "mlflow-PASSWORD-do-not-log-91c2",
           "TRAINLAB_TEST_API_TOKEN": "api-TOKEN-do-not-log-55e0"}
URL_PASSWORD = "url-PASSWORD-do-not-log-c0de"
CONCURRENT = 4
FALLBACK_INDEX = CONCURRENT - 1  # this one is pointed at an unreachable server, with fallback_to_local on


@pytest.fixture(scope="session")
def tracked_runs(tmp_path_factory, prepared):
    """Four classifier trainings started together in one folder, all logging to its default `sqlite:///mlflow.db`
    (the last one via an unreachable server URL with credentials in it and `tracking.fallback_to_local`); secrets in
    the environment; 8 epochs each, so that the runs overlap in time even after the fallback one's probe of its
    unreachable server. Returns (folder, [(exit code, output, params dict)] in order)."""
    import socket
    import subprocess

    from tests.reliability.factories import run_env, stage_command

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    root = tmp_path_factory.mktemp("tracked")
    make_workspace(root, prepared, tiny_params())
    runs = []
    for i in range(CONCURRENT):
        tracking = {"enabled": True}
        if i == FALLBACK_INDEX:
            tracking.update(uri=f"http://alice:{URL_PASSWORD}@127.0.0.1:{closed_port}", fallback_to_local=True)
        params = tiny_params({"base": {"seed": 10 + i}, "tracking": tracking,
                              "classifier": {"epochs": 8, "batch_size": 256, "checkpoint_every_steps": 0,
                                             "min_steps": None}})
        write_params(root / f"params_{i}.yaml", params)
        runs.append(params)
    started = time.perf_counter()
    procs = [subprocess.Popen(stage_command("stages.train_classifier", "data/prepared/classification",
                                            f"models/classifier_{i}", f"reports/classifier_{i}", "--params",
                                            f"params_{i}.yaml"),
                              cwd=root, env=run_env(**SECRETS), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True) for i in range(CONCURRENT)]
    outputs = [proc.communicate(timeout=900)[0] for proc in procs]
    TIMINGS["four_tracked_trainings"] = time.perf_counter() - started
    return root, [(proc.returncode, out, params) for proc, out, params in zip(procs, outputs, runs, strict=True)]
