"""Tests for the MLflow tracking adapter against a real MLflow with a throwaway SQLite store in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from benchmarks.processes import NO_JOBS, free_port
from tests.tracking.conftest import client_for
from trainlab.core.errors import TrackingUnavailable
from trainlab.core.provenance import git_state
from trainlab.tracking.lineage import data_hash
from trainlab.tracking.queue import QueuedTracker, RunOpener, queued_run, start_run_in_background
from trainlab.tracking.retry import retry as _retry
from trainlab.tracking.runs import open_run, plan_run, start_run
from trainlab.tracking.tracker import NullTracker, flatten_params
from trainlab.tracking.uri import mlflow_client, resolve_tracking_uri

mlflow = pytest.importorskip("mlflow")

REPO = Path(__file__).resolve().parents[2]
PARAMS_FILE = REPO / "params.yaml"


def load_registered(store: Path, model_uri: str):
    """mlflow.pytorch.load_model reads only MLflow's process-global URIs: point them at `store`, then restore."""
    uri = f"sqlite:///{store}/mlflow.db"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        return mlflow.pytorch.load_model(model_uri)
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


class Doubler(torch.nn.Module):
    """Data-dependent control flow: torch.export cannot trace it, so log_model must fall back to pickle."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


# ---------------------------------------------------------------------------------------------------------------------


def test_flatten_params_dotted_string_values(params):
    flat = flatten_params(params)
    assert flat["classifier.lr"] == str(params.classifier.lr)
    assert flat["data.segmentation.canvas_size"] == str(params.data.segmentation.canvas_size)
    assert flat["classifier.pretrained"] == "None"
    assert all(isinstance(v, str) for v in flat.values())
    assert flatten_params({"a": {"b": {"c": 1}, "d": [1, 2]}, "e": True}) == {"a.b.c": "1", "a.d": "[1, 2]",
                                                                           "e": "True"}


def test_resolve_tracking_uri_order(params, workdir, monkeypatch):
    assert resolve_tracking_uri(params) == f"sqlite:///{workdir.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example.invalid:5000")
    assert resolve_tracking_uri(params) == "http://example.invalid:5000"
    params.tracking.uri = "sqlite:///sub/runs.db"  # relative: made absolute against the cwd
    assert resolve_tracking_uri(params) == f"sqlite:///{workdir.resolve()}/sub/runs.db"


def test_run_records_params_metrics_artifacts_tags_and_model(params, store, capfd):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir = store / "report"
    report_dir.mkdir()
    (report_dir / "a.txt").write_text("a")
    (store / "notes.md").write_text("# notes")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    many = {f"k{i}": i for i in range(650)}  # more than MLflow's 100 params per batch

    with start_run(params, stage="train_classifier", tags={"purpose": "test"}) as tracker:
        tracker.log_params(params)
        tracker.log_params({"extra": many})
        for step in range(3):
            tracker.log_metrics({"train/loss": 1.0 / (step + 1), "val/acc": torch.tensor(0.5 + step / 10)}, step=step)
        with pytest.warns(RuntimeWarning, match="non-finite"):
            tracker.log_metrics({"bad": float("nan"), "good": 1.0}, step=3)
        tracker.log_artifact(store / "notes.md")
        tracker.log_artifact(report_dir, artifact_path="reports")
        tracker.log_dict({"a": 1}, "summary.json")
        tracker.log_figure(fig, "plots/curve.png")
        tracker.log_text("hello", "hello.txt")
        tracker.set_tags({"phase": "done"})
        model = torch.nn.Linear(4, 2)
        model.train()
        version = tracker.log_model(model, "classifier", torch.randn(8, 4), registered_model_name="tiny")
        assert model.training, "log_model must restore the caller's train/eval mode"
        run_id = tracker.run_id
    plt.close(fig)

    client = client_for(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["classifier.lr"] == str(params.classifier.lr)
    assert run.data.params["extra.k649"] == "649"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [0, 1, 2]
    assert "bad" not in run.data.metrics and run.data.metrics["good"] == 1.0
    tags = run.data.tags
    assert tags["stage"] == "train_classifier"
    assert tags["params_hash"] == params.section_hash()
    assert tags["git_commit"] and tags["git_dirty"] in ("true", "false", "unknown")
    assert tags["data_hash"] == "none"  # no dvc.lock in this cwd
    assert tags["device"] == "cpu" and tags["torch_version"] == torch.__version__
    assert tags["purpose"] == "test" and tags["phase"] == "done"

    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"environment.json", "notes.md", "summary.json", "hello.txt", "plots", "reports"} <= top
    assert [a.path for a in client.list_artifacts(run_id, "reports/report")] == ["reports/report/a.txt"]
    env = json.loads(Path(client.download_artifacts(run_id, "environment.json", str(store))).read_text())
    assert env["device"] == "cpu" and "pkg_torch" in env

    # Artifacts live beside the DB, never in a ./mlruns file store.
    assert (store / "mlartifacts" / params.tracking.experiment).is_dir()
    assert not (store / "mlruns").exists()

    assert version == "1"
    mv = client.get_model_version("tiny", "1")
    assert mv.run_id == run_id and mv.source.startswith("models:/m-")
    logged = client.get_logged_model(mv.source.removeprefix("models:/"))
    assert logged.experiment_id == run.info.experiment_id
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": "tiny", "version": 1}]
    loaded = load_registered(store, "models:/tiny/1")
    x = torch.randn(5, 4)
    assert torch.allclose(loaded(x), model.eval()(x), atol=1e-6)  # batch dimension stays dynamic

    err = capfd.readouterr().err
    assert "mismatch" not in err and "Successfully registered" not in err and "pickle" not in err.lower()


def test_model_not_registered_when_disabled(params, store):
    params.tracking.register_models = False
    with start_run(params, stage="train_text") as tracker:
        assert tracker.log_model(torch.nn.Linear(4, 2), "text", np.zeros((2, 4), np.float32), "tiny") is None
        assert tracker.last_model_uri.startswith("models:/m-")
    assert client_for(store).search_registered_models() == []


def test_unexportable_model_falls_back_to_pickle(params, store, capfd):
    with start_run(params, stage="train_text") as tracker:
        version = tracker.log_model(Doubler(), "doubler", torch.ones(4, 3), registered_model_name="doubler")
    assert version == "1"
    assert "logging it in MLflow's pickle format" in capfd.readouterr().err
    loaded = load_registered(store, "models:/doubler/1")
    assert torch.equal(loaded(torch.ones(2, 3)), torch.full((2, 3), 2.0))
    # the failed pt2 attempt leaves no empty LoggedModel behind
    client = client_for(store)
    exp = client.get_experiment_by_name(params.tracking.experiment)
    assert len(client.search_logged_models(experiment_ids=[exp.experiment_id])) == 1


def test_models_register_in_the_tracking_store_whatever_the_global_registry(params, store, tmp_path_factory,
                                                                          monkeypatch, migrated_db):
    elsewhere = tmp_path_factory.mktemp("other_registry") / "mlflow.db"
    shutil.copyfile(migrated_db, elsewhere)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{elsewhere}")  # e.g. left behind by another tool
    with start_run(params, stage="train_classifier") as tracker:
        version = tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(2, 4), "tiny")
    assert version == "1"
    assert [m.name for m in client_for(store).search_registered_models()] == ["tiny"]
    assert mlflow_client(f"sqlite:///{elsewhere}").search_registered_models() == []


def test_models_register_in_the_tracking_store_whatever_the_global_tracking_uri(params, store, tmp_path_factory,
                                                                              migrated_db):
    elsewhere = tmp_path_factory.mktemp("other_tracking") / "mlflow.db"
    shutil.copyfile(migrated_db, elsewhere)
    mlflow.set_tracking_uri(f"sqlite:///{elsewhere}")  # a global left behind by some other code in the process
    params.tracking.uri = f"sqlite:///{store}/mlflow.db"  # (it also set $MLFLOW_TRACKING_URI, which params override)
    try:
        with start_run(params, stage="train_classifier") as tracker:
            version = tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(2, 4), "tiny")
        assert mlflow.get_tracking_uri() == f"sqlite:///{elsewhere}"  # put back as it was
    finally:
        mlflow.set_tracking_uri(None)
    assert version == "1" and [m.name for m in client_for(store).search_registered_models()] == ["tiny"]


def test_logging_a_model_leaves_mlflows_globals_as_they_were(params, store, monkeypatch):
    from mlflow.tracking._tracking_service import utils as tracking_utils

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/mlflow.db")
    with start_run(params, stage="train_classifier") as tracker:
        tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(2, 4), "tiny")
    assert tracking_utils._tracking_uri is None  # the variable was not turned into a sticky global
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{store}/mlflow.db"


def test_deleted_experiment_is_reported(params, store):
    client = client_for(store)
    client.delete_experiment(client.create_experiment(params.tracking.experiment))
    with pytest.raises(TrackingUnavailable, match="deleted"):
        with start_run(params, stage="prepare"):
            pytest.fail("the body must not run")


def test_background_run_replays_calls_made_before_it_opened(params, store):
    with start_run_in_background(params, stage="train_classifier") as tracker:
        assert isinstance(tracker, QueuedTracker)
        tracker.log_params({"classifier": {"lr": 0.5}})  # most likely queued: MLflow takes ~1 s to open
        tracker.log_metrics({"val_accuracy": 0.25}, step=1)
        tracker.set_tags({"task": "classifier"})
        run_id = tracker.run_id  # waits for the run: the store answers
        tracker.log_metrics({"val_accuracy": 0.75}, step=2)
    assert not tracker.failed.is_set()
    client = client_for(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["classifier.lr"] == "0.5" and run.data.tags["task"] == "classifier"
    history = client.get_metric_history(run_id, "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75)]


def test_calls_made_before_the_run_opens_are_queued_then_made_in_order(params, store):
    """Deterministic: the run opens when the test says, after the calls, so they must have been queued."""
    import threading

    gate = threading.Event()
    plan = plan_run(params, "train_classifier", resolve_tracking_uri(params))

    def open_when_let():
        assert gate.wait(30)
        return open_run(plan)

    with queued_run(open_when_let, params.tracking, "train_classifier") as tracker:
        tracker.log_params({"classifier": {"lr": 0.5}})
        tracker.log_metrics({"loss": 2.0}, step=1)
        tracker.log_metrics({"loss": 1.0}, step=2)
        assert client_for(store).search_experiments(filter_string=f"name = '{params.tracking.experiment}'") == []
        gate.set()
        tracker.log_metrics({"loss": 0.5}, step=3)
    run = client_for(store).get_run(tracker.run_id)
    assert run.data.params["classifier.lr"] == "0.5" and not tracker.failed.is_set()
    assert run.info.status == "FINISHED" and run.info.run_name == plan.run_name
    history = client_for(store).get_metric_history(tracker.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0), (3, 0.5)]


def test_a_run_never_opened_is_spooled_with_its_plan_and_its_replay_opens_it_once(params, store, tmp_path, capfd):
    """The server away from the stage's start to its end: the spool keeps the run's plan; replaying opens the run as
    the stage would have (name, tags, environment), makes the calls, and a second replay finds that run again."""
    import requests

    from trainlab.tracking import spool
    from trainlab.tracking.outage import TrackingOutage

    class Away(RunOpener):
        def __call__(self):
            self.plan = self.plan or self._make_plan()
            raise requests.ConnectionError("Connection refused")

    params.tracking.outage_grace_s = 1
    uri = resolve_tracking_uri(params)
    opener = Away(lambda: plan_run(params, "train_text", uri, tags={"task": "text"}))
    with pytest.raises(TrackingOutage, match="never opened"):
        with queued_run(opener, params.tracking, "train_text", spool_key="k1", uri=uri) as tracker:
            tracker.log_params({"text": {"lr": 0.1}})
            tracker.log_metrics({"val_accuracy": 0.5}, step=1)
            assert tracker.run_id == "" and not tracker.failed.is_set()
    folder = spool.spool_folder("train_text", "k1")
    assert spool.read_run(folder)["run_id"] is None and spool.read_run(folder)["plan"]["run_name"]
    backup = tmp_path / "spool-copy"
    shutil.copytree(folder, backup)
    client = client_for(store)
    assert client.search_experiments(filter_string=f"name = '{params.tracking.experiment}'") == []

    run_id, made = spool.replay(folder)
    assert made == 3 and spool.read_run(folder)["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == opener.plan.run_name
    assert run.data.tags["task"] == "text" and run.data.tags["stage"] == "train_text"
    assert run.data.params["text.lr"] == "0.1" and "environment.json" in {a.path for a in client.list_artifacts(run_id)}

    shutil.rmtree(folder)  # the record of the replay lost: replayed again from the start, it lands nothing twice
    shutil.copytree(backup, folder)
    assert spool.replay(folder)[0] == run_id
    experiment = client.get_experiment_by_name(params.tracking.experiment).experiment_id
    assert [r.info.run_id for r in client.search_runs([experiment])] == [run_id]
    assert [m.step for m in client.get_metric_history(run_id, "val_accuracy")] == [1]


def test_a_run_that_failed_to_open_raises_its_error_from_every_call():
    def refuse():
        raise TrackingUnavailable("the store cannot be opened")

    tracker = QueuedTracker(refuse, queue_size=10, execute=lambda run, call: None)
    assert tracker.failed.wait(10) and isinstance(tracker.error, TrackingUnavailable)
    with pytest.raises(TrackingUnavailable, match="cannot be opened"):
        tracker.log_metrics({"x": 1.0})
    with pytest.raises(TrackingUnavailable):
        tracker.run_id


def test_background_run_ends_failed_with_the_bodys_error_and_its_queued_params(params, store):
    with pytest.raises(ZeroDivisionError):
        with start_run_in_background(params, stage="train_text") as tracker:
            tracker.log_params({"text": {"lr": 0.1}})
            raise ZeroDivisionError("the body failed")
    client = client_for(store)
    (run,) = client.search_runs([client.get_experiment_by_name(params.tracking.experiment).experiment_id])
    assert run.info.status == "FAILED" and run.data.params["text.lr"] == "0.1"


def test_background_run_that_cannot_open_sets_failed_and_raises_its_error(params, store, capfd):
    client = client_for(store)
    client.delete_experiment(client.create_experiment(params.tracking.experiment))
    with pytest.raises(TrackingUnavailable, match="deleted"):
        with start_run_in_background(params, stage="train_segmenter") as tracker:
            # no logging call here: one made after the opening failed raises that error itself (tested below)
            assert tracker.failed.wait(60), "opening the run should have failed"
            raise RuntimeError("training stopped because the run could not open")
    assert "note: training stopped because the run could not open" in capfd.readouterr().err
    with pytest.raises(TrackingUnavailable):  # any later use raises the same error
        tracker.log_metrics({"x": 1.0})


def test_disabled_yields_null_tracker_and_writes_nothing(params, workdir):
    params.tracking.enabled = False
    with start_run(params, stage="evaluate") as tracker:
        assert isinstance(tracker, NullTracker) and tracker.run_id == ""
        tracker.log_params(params)
        tracker.log_metrics({"x": 1.0}, step=1)
        tracker.log_text("t", "t.txt")
        assert tracker.log_model(torch.nn.Linear(4, 2), "m", torch.zeros(2, 4), "m") is None
    assert list(workdir.iterdir()) == []


def test_unreachable_server_raises_quickly(params, workdir):
    port = free_port()
    params.tracking.uri = f"http://127.0.0.1:{port}"
    params.tracking.connect_timeout_s = 1
    started = time.monotonic()
    with pytest.raises(TrackingUnavailable) as info:
        with start_run(params, stage="train_classifier"):
            pytest.fail("the body must not run")
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "fallback_to_local" in message and "MLFLOW_TRACKING_URI" not in message
    assert not (workdir / "mlflow.db").exists()


def test_unreachable_env_server_message_names_env(params, workdir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    params.tracking.connect_timeout_s = 1
    with pytest.raises(TrackingUnavailable, match="MLFLOW_TRACKING_URI"):
        resolve_tracking_uri(params, check=True)


def test_unreachable_server_falls_back_to_local(params, store, capfd):
    params.tracking.uri = f"http://127.0.0.1:{free_port()}"
    params.tracking.connect_timeout_s = 1
    params.tracking.fallback_to_local = True
    with start_run(params, stage="train_classifier") as tracker:
        tracker.log_metrics({"loss": 0.5}, step=0)
        assert tracker.tracking_uri == f"sqlite:///{store.resolve()}/mlflow.db"
    warning = [line for line in capfd.readouterr().err.splitlines() if "unreachable" in line]
    assert len(warning) == 1 and "logging to sqlite:///" in warning[0]
    assert client_for(store).get_run(tracker.run_id).data.metrics == {"loss": 0.5}


def test_failing_body_marks_run_failed(params, store):
    with pytest.raises(ValueError, match="boom"):
        with start_run(params, stage="train_segmenter") as tracker:
            tracker.log_metrics({"loss": 1.0})
            raise ValueError("boom")
    assert client_for(store).get_run(tracker.run_id).info.status == "FAILED"


def test_nesting_by_argument_and_env(params, store, monkeypatch):
    with start_run(params, stage="pipeline", run_name="parent") as parent:
        with start_run(params, stage="prepare", parent_run_id=parent.run_id) as child:
            pass
        monkeypatch.setenv("TRAINLAB_PARENT_RUN_ID", parent.run_id)
        with start_run(params, stage="train_text") as env_child:
            pass
    client = client_for(store)
    assert client.get_run(parent.run_id).data.tags.get("mlflow.parentRunId") is None
    assert client.get_run(parent.run_id).info.run_name == "parent"
    for run_id in (child.run_id, env_child.run_id):
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == parent.run_id


def test_missing_parent_is_not_linked(params, store, capfd):
    with start_run(params, stage="prepare", parent_run_id="0" * 32) as tracker:
        pass
    assert "mlflow.parentRunId" not in client_for(store).get_run(tracker.run_id).data.tags
    assert "not found" in capfd.readouterr().err


def test_data_hash_from_dvc_lock(params, store):
    lock = {
        "schema": "2.0",
        "stages": {
            "prepare": {"cmd": "python -m stages.prepare", "outs": [
                {"path": "data/prepared/classifier", "hash": "md5", "md5": "aaa.dir"}]},
            "train_classifier": {"cmd": "python -m stages.train_classifier", "deps": [
                {"path": "data/prepared/classifier", "hash": "md5", "md5": "old.dir"},
                {"path": "trainlab/engine", "hash": "md5", "md5": "bbb.dir"}]},
        },
    }
    (store / "dvc.lock").write_text(yaml.safe_dump(lock))
    first = data_hash("train_classifier")
    assert len(first) == 12 and first != "none"
    assert data_hash("evaluate") == "none"
    # The upstream out (rewritten as soon as prepare ran) wins over this stage's stale dep entry.
    lock["stages"]["prepare"]["outs"][0]["md5"] = "ccc.dir"
    (store / "dvc.lock").write_text(yaml.safe_dump(lock))
    second = data_hash("train_classifier")
    assert second != first
    lock["stages"]["train_classifier"]["deps"][0]["md5"] = "ccc.dir"  # what dvc writes after the stage
    (store / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert data_hash("train_classifier") == second
    with start_run(params, stage="train_classifier") as tracker:
        pass
    assert client_for(store).get_run(tracker.run_id).data.tags["data_hash"] == second


def test_retry_only_on_database_locked(monkeypatch):
    import sqlite3

    monkeypatch.setattr("trainlab.tracking.retry._RETRY_BASE_DELAY_S", 0.001)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("wrapped") from sqlite3.OperationalError("database is locked")
        return "ok"

    assert _retry(flaky) == "ok" and len(calls) == 3

    def broken():
        calls.append(1)
        raise sqlite3.OperationalError("no such table: runs")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError):
        _retry(broken)
    assert len(calls) == 1


@pytest.mark.reliability
def test_concurrent_writers_share_one_sqlite_store(workdir):
    """Several processes create the experiment and log to one fresh SQLite DB at once."""
    script = textwrap.dedent(f"""
        import sys
        from trainlab.core.config import load_params
        from trainlab.tracking.runs import start_run
        p = load_params({str(PARAMS_FILE)!r})
        p.base.device = "cpu"
        with start_run(p, stage="sweep_" + sys.argv[1]) as t:
            t.log_params(p.classifier)
            for step in range(30):
                t.log_metrics({{"loss": 1.0 / (step + 1)}}, step=step)
        print(t.run_id)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err
    client = client_for(workdir)
    experiments = [e for e in client.search_experiments() if e.name == "trainlab"]
    assert len(experiments) == 1
    for out, _ in outs:
        run_id = out.strip().splitlines()[-1]
        assert len(client.get_metric_history(run_id, "loss")) == 30


@pytest.mark.integration
def test_logs_through_a_real_tracking_server(params, workdir, migrated_db, tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1: health probe passes, artifacts and models go through the server."""
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    if not mlflow_cli.exists():
        pytest.skip("mlflow CLI not installed beside the interpreter")
    server_dir = tmp_path_factory.mktemp("mlflow_server")
    shutil.copyfile(migrated_db, server_dir / "server.db")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(mlflow_cli), "server", "--backend-store-uri", f"sqlite:///{server_dir}/server.db",
         "--artifacts-destination", str(server_dir / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=server_dir, env={**os.environ, **NO_JOBS}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import requests

        deadline = time.monotonic() + 120  # first start is slow on this kind of machine (~30 s)
        while True:
            try:
                if requests.get(f"{uri}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert server.poll() is None, "mlflow server exited during startup"
            assert time.monotonic() < deadline, "mlflow server did not become healthy in 120 s"
            time.sleep(0.5)

        params.tracking.uri = uri
        params.tracking.connect_timeout_s = 2
        with start_run(params, stage="train_classifier") as tracker:
            tracker.log_metrics({"loss": 0.25}, step=1)
            tracker.log_text("hi", "hi.txt")
            version = tracker.log_model(torch.nn.Linear(4, 2), "classifier", torch.randn(4, 4), "served")
        client = mlflow.MlflowClient(tracking_uri=uri)
        run = client.get_run(tracker.run_id)
        assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith("mlflow-artifacts:/")
        assert {"environment.json", "hi.txt"} <= {a.path for a in client.list_artifacts(tracker.run_id)}
        assert client.get_model_version("served", version).run_id == tracker.run_id
        assert (server_dir / "artifacts").is_dir()
        assert not (workdir / "mlflow.db").exists()  # nothing fell back to the local store
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


# --------------------------------------------------------------------------------------------------------------------
# What the runs table shows: names, dataset inputs, the experiment's kind


def test_run_names_say_stage_and_commit_never_the_seeded_random(params, store, monkeypatch):
    import random
    import subprocess as sp

    identity = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@x"}
    (store / "a.txt").write_text("a")
    for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-qm", "one"]):
        sp.run(["git", *args], cwd=store, check=True, env={**os.environ, **identity})
    short = sp.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=store, check=True, capture_output=True,
                   text=True).stdout.strip()
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    git_state.cache_clear()  # one state per process (a stage's): this test changes it
    names = []
    for stage in ("train_classifier", "train_segmenter", "train_text", "evaluate"):
        random.seed(42)  # what the stages do before MLflow opens the run: the same state each time
        with start_run(params, stage=stage) as tracker:
            pass
        names.append(client_for(store).get_run(tracker.run_id).info.run_name)
    assert names == [f"{s} {short}" for s in ("train_classifier", "train_segmenter", "train_text", "evaluate")]

    (store / "a.txt").write_text("changed")
    git_state.cache_clear()
    monkeypatch.setenv("DVC_EXP_NAME", "lr-seed-03")  # what `dvc exp run` and the flows' experiments set
    with start_run(params, stage="train_classifier") as in_experiment:
        pass
    monkeypatch.delenv("DVC_EXP_NAME")
    with start_run(params, stage="train_classifier") as dirty:
        pass
    client = client_for(store)
    assert client.get_run(in_experiment.run_id).info.run_name == "lr-seed-03 train_classifier"
    assert client.get_run(dirty.run_id).info.run_name == f"train_classifier {short}-dirty"
    git_state.cache_clear()


def test_dataset_inputs_carry_the_dvc_hash_and_context(params, store):
    import hashlib

    from trainlab.tracking.lineage import split_inputs

    folder = store / "data" / "prepared" / "classification"
    folder.mkdir(parents=True)
    for split in ("train", "val", "test"):
        (folder / f"{split}.safetensors").write_bytes(split.encode() * 100)
    with start_run(params, stage="train_classifier", datasets=split_inputs(folder)) as tracker:
        pass
    run = client_for(store).get_run(tracker.run_id)
    logged = {(d.dataset.name, d.dataset.digest, json.loads(d.dataset.source)["uri"],
               {t.key: t.value for t in d.tags}["mlflow.data.context"]) for d in run.inputs.dataset_inputs}
    assert logged == {(f"classification/{split}", hashlib.md5(split.encode() * 100).hexdigest(),
                       str(folder / f"{split}.safetensors"), context)
                      for split, context in (("train", "training"), ("val", "validation"), ("test", "test"))}

    (folder / "train.safetensors").write_bytes(b"other data")  # other data: another digest in the Dataset column
    with start_run(params, stage="train_classifier", datasets=split_inputs(folder, ("train",))) as other:
        pass
    digest, = [d.dataset.digest for d in client_for(store).get_run(other.run_id).inputs.dataset_inputs]
    assert digest == hashlib.md5(b"other data").hexdigest()


def test_experiment_kind_is_model_development_new_or_existing(params, store):
    client = client_for(store)
    params.tracking.experiment = "made-here"
    with start_run(params, stage="prepare"):
        pass
    assert client.get_experiment_by_name("made-here").tags["mlflow.experimentKind"] == "custom_model_development"

    old = client.create_experiment("made-before")  # an existing experiment without a kind gets one
    params.tracking.experiment = "made-before"
    with start_run(params, stage="prepare"):
        pass
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
