"""One contract, three trackers: NullTracker (tracking off), MlflowTracker (start_run) and QueuedTracker
(start_run_in_background) are each held to trainlab.engine.contract.Tracker: the same methods and arguments, the same
calls landing in a real MLflow store (or nowhere, tracking off), the same bad calls failing the same way."""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager

import pytest
import torch

from tests.tracking.conftest import client_for
from trainlab.engine.contract import Tracker
from trainlab.tracking.queue import start_run_in_background
from trainlab.tracking.runs import start_run

KINDS = ("null", "mlflow", "queued")
METHODS = sorted(name for name, value in vars(Tracker).items() if callable(value) and not name.startswith("_"))


@contextmanager
def tracker_of(kind: str, params):
    if kind == "null":
        params.tracking.enabled = False
    opening = start_run_in_background if kind == "queued" else start_run
    with opening(params, stage="train_classifier") as tracker:
        yield tracker


def test_the_contract_names_what_stages_and_the_engine_use():
    assert METHODS == ["log_artifact", "log_dict", "log_figure", "log_metrics", "log_model", "log_params",
                       "log_text", "set_tags"]
    assert set(Tracker.__annotations__) == {"run_id", "experiment_id", "tracking_uri", "failed"}


@pytest.mark.parametrize("kind", KINDS)
def test_each_tracker_has_the_contracts_methods_and_attributes(kind, params, store):
    with tracker_of(kind, params) as tracker:
        assert isinstance(tracker, Tracker)
        for name in METHODS:
            wanted = list(inspect.signature(getattr(Tracker, name)).parameters.values())[1:]
            has = list(inspect.signature(getattr(tracker, name)).parameters.values())
            assert [(p.name, p.kind, p.default) for p in has[:len(wanted)]] == \
                [(p.name, p.kind, p.default) for p in wanted], f"{type(tracker).__name__}.{name}"
            assert all(p.default is not inspect.Parameter.empty for p in has[len(wanted):]), name  # extras optional
        assert isinstance(tracker.failed, threading.Event) and not tracker.failed.is_set()
        assert all(isinstance(getattr(tracker, a), str) for a in ("run_id", "experiment_id", "tracking_uri"))
        assert (tracker.run_id == "") == (kind == "null")


@pytest.mark.parametrize("kind", KINDS)
def test_each_tracker_logs_the_same_calls(kind, params, store, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "history.csv").write_text("epoch,loss\n1,0.5\n")
    (tmp_path / "model_files").mkdir()
    (tmp_path / "model_files" / "config.json").write_text("{}")
    fig, _ = plt.subplots()
    with tracker_of(kind, params) as tracker:
        tracker.log_params({"classifier": {"lr": 0.5}})
        tracker.log_metrics({"loss": 1.0}, step=1)
        tracker.log_metrics({"loss": 0.5}, step=2)
        tracker.set_tags({"task": "classifier"})
        tracker.log_dict({"a": 1}, "d.json")
        tracker.log_text("hello", "notes.txt")
        tracker.log_figure(fig, "curve.png")
        tracker.log_artifact(tmp_path / "history.csv")
        tracker.log_artifact(tmp_path / "model_files", "sub")
        tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.zeros(2, 4), "trainlab-classifier")
    plt.close(fig)
    client = client_for(store)
    experiment = client.get_experiment_by_name(params.tracking.experiment)
    if kind == "null":
        assert experiment is None and tracker.run_id == ""
        return
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"classifier.lr": "0.5"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 1.0), (2, 0.5)]
    assert run.data.tags["task"] == "classifier"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= \
        {"environment.json", "d.json", "notes.txt", "curve.png", "history.csv", "sub"}
    assert [(str(v.version), v.run_id) for v in client.search_model_versions("name = 'trainlab-classifier'")] == \
        [("1", run.info.run_id)]


@pytest.mark.parametrize("kind", KINDS)
def test_each_tracker_refuses_the_same_bad_calls_the_same_way(kind, params, store, tmp_path):
    with tracker_of(kind, params) as tracker:
        with pytest.raises(FileNotFoundError, match="no such file"):
            tracker.log_artifact(tmp_path / "missing.csv")
        with pytest.raises(ValueError, match="input_example"):
            tracker.log_model(torch.nn.Linear(4, 2), "classifier", None)
        with pytest.raises(TypeError, match="metric 'loss'"):
            tracker.log_metrics({"loss": "low"}, step=1)
        with pytest.warns(RuntimeWarning, match="non-finite"):
            tracker.log_metrics({"loss": 0.25, "grad_norm": float("inf")}, step=2)
    if kind != "null":
        client = client_for(store)
        assert [m.value for m in client.get_metric_history(tracker.run_id, "loss")] == [0.25]
        assert client.get_metric_history(tracker.run_id, "grad_norm") == []
