"""Fixtures of the tracking tests: a clean working folder and a real MLflow SQLite store in it, the repo's params."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

from trainlab.core.config import load_params
from trainlab.tracking.uri import mlflow_client

PARAMS_FILE = Path(__file__).resolve().parents[2] / "params.yaml"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A clean cwd with no tracking env: mlflow.db and mlartifacts land in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.delenv("TRAINLAB_PARENT_RUN_ID", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    """An empty, fully migrated MLflow DB made once: creating one runs ~6 s of alembic migrations (fsync-bound)."""
    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}")
    return path


@pytest.fixture
def store(workdir, migrated_db) -> Path:
    """workdir with a copy of the migrated empty DB as ./mlflow.db (the default location)."""
    shutil.copyfile(migrated_db, workdir / "mlflow.db")
    return workdir


@pytest.fixture
def params(workdir):
    p = load_params(PARAMS_FILE)
    p.base.device = "cpu"
    return p


def client_for(workdir: Path) -> mlflow.MlflowClient:
    return mlflow_client(f"sqlite:///{workdir}/mlflow.db")
