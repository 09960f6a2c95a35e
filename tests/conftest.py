"""Shared fixtures: the repo's params, tiny configs, a temporary MLflow store; markers for gpu tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def repo_params():
    from trainlab.config import load_params

    return load_params(REPO / "params.yaml")


@pytest.fixture
def tmp_mlflow(tmp_path, monkeypatch):
    """A fresh SQLite MLflow store in tmp_path, used through MLFLOW_TRACKING_URI."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
