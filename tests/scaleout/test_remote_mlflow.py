"""A training stage against a real `mlflow server` over HTTP: params, metrics, artifacts and the registered model are
found on the server (SQLite backend, artifacts proxied to its local artifact root), nothing in the stage's folder."""

from __future__ import annotations

import io
import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tests.scaleout.conftest import files_under, run_stage, timed, tiny_params, write_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_training_stage_logs_to_a_remote_tracking_server(mlflow_server, prepared, tmp_path, monkeypatch):
    write_params(tmp_path / "params.yaml", tiny_params({"tracking": {"connect_timeout_s": 10}}))
    with timed("train_classifier against the mlflow server"):
        run_stage("stages.train_classifier", [str(prepared / "data/prepared/classification"), "models/classifier",
                                              "reports/classifier"], tmp_path, MLFLOW_TRACKING_URI=mlflow_server.uri)

    # the stage's folder holds its outputs and nothing of MLflow's: everything went over HTTP
    written = files_under(tmp_path)
    assert not [f for f in written if f.startswith(("mlflow.db", "mlartifacts/", "mlruns/"))], written
    info = {"run_id": json.loads((tmp_path / "reports/classifier/run.json").read_text())["mlflow_run_id"]}

    client = mlflow.MlflowClient(tracking_uri=mlflow_server.uri)
    experiment = client.get_experiment_by_name("trainlab")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [info["run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith("mlflow-artifacts:/")
    # params, tags and metrics
    assert run.data.params["classifier.width"] == "8" and run.data.params["base.seed"] == "5"
    assert run.data.params["world_size"] == "1"
    assert run.data.tags["stage"] == "train_classifier" and run.data.tags["params_hash"]
    assert {"test_accuracy", "test_loss", "train_loss", "val_accuracy", "samples_per_s"} <= set(run.data.metrics)
    (epoch,) = client.get_metric_history(run.info.run_id, "epoch")  # MLflow's step: the optimizer step
    assert epoch.value == 1 and [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == \
        [epoch.step]
    # artifacts: listed and downloaded through the server, stored under its --artifacts-destination
    listed = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"environment.json", "history.csv", "model_files"} <= listed, listed
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="history.csv",
                                                tracking_uri=mlflow_server.uri, dst_path=str(tmp_path / "dl"))
    assert Path(local).read_text() == (tmp_path / "reports/classifier/history.csv").read_text()
    stored = files_under(mlflow_server.artifacts)
    assert any(f.endswith("history.csv") for f in stored) and any(f.endswith("environment.json") for f in stored)
    # the registered model: version 1 of trainlab-classifier, from this run, loadable from the server
    version = client.get_model_version("trainlab-classifier", "1")
    assert version.run_id == run.info.run_id and version.status == "READY"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)  # what `models:/` URIs resolve against
    with timed("load the registered model over HTTP"):
        model = mlflow.pyfunc.load_model("models:/trainlab-classifier/1")
    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png, "PNG")
    predicted = model.predict(pd.DataFrame({"image": [png.getvalue()] * 2}))  # raw image bytes in
    assert len(predicted) == 2 and set(predicted["label"]) <= {"cat", "dog", "fox"}
    assert {"prob_cat", "prob_dog", "prob_fox"} <= set(predicted.columns)
