"""MLflow: an unreachable server is reported fast and before training (or falls back to the local store when asked);
four training processes logging at once to the default SQLite store lose no run, param or metric."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from benchmarks.processes import free_port
from tests.reliability.conftest import (
    CONCURRENT,
    FALLBACK_INDEX,
    URL_PASSWORD,
    make_workspace,
)
from tests.reliability.factories import CLASSIFIER_ARGS, run_stage, tiny_params, tree

pytestmark = pytest.mark.reliability


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a hung server, or a firewall that drops)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    accepted = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    sock.close()


@pytest.mark.parametrize("how", ["refused-tracking-uri", "silent-server-env-var"])
def test_unreachable_server_is_reported_within_10_s_before_training(tmp_path, prepared, silent_server, how):
    if how == "refused-tracking-uri":
        uri, env, source = f"http://127.0.0.1:{free_port()}", {}, "tracking.uri"
        tracking = {"enabled": True, "uri": uri}
    else:  # the default connect_timeout_s, a password in the URL
        uri, source = f"http://alice:{URL_PASSWORD}@127.0.0.1:{silent_server}", "MLFLOW_TRACKING_URI"
        env, tracking = {"MLFLOW_TRACKING_URI": uri}, {"enabled": True}
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params({"tracking": tracking}))
    before = tree(ws)
    started = time.monotonic()
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, ws, timeout=60, **env)
    elapsed = time.monotonic() - started

    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # nothing ran: no epoch, no progress
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "is unreachable" in error and f"(from {source})" in error and "tracking.fallback_to_local: true" in error
    if how == "silent-server-env-var":
        assert "no answer within 5s" in error and f"alice:***@127.0.0.1:{silent_server}" in error
    assert URL_PASSWORD not in proc.stdout + proc.stderr
    assert tree(ws) == before  # nothing written: no checkpoint, model, report or mlflow.db


@pytest.mark.parametrize("module, args", [
    ("stages.prepare", ["data/prepared_new", "reports/data_stats.json"]),
    ("stages.evaluate", ["data/prepared", "models", "reports/evaluate"]),
    ("stages.profile", ["data/prepared", "models", "reports/profile"]),
])
def test_other_stages_report_an_unreachable_server_before_their_work(tmp_path, prepared, module, args):
    uri = f"http://127.0.0.1:{free_port()}"
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params({"tracking": {"enabled": True, "uri": uri}}))
    before = tree(ws)
    started = time.monotonic()
    proc = run_stage(module, args, ws, timeout=60)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert time.monotonic() - started < 10
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "is unreachable" in proc.stderr and "(from tracking.uri)" in proc.stderr
    assert tree(ws) == before


def expected_params(params: dict, model_info: dict) -> set[str]:
    """The params a training run logs: its sections, a few counts, and what each auto became (prepare's choices and
    training's, as the model's info.json records them)."""
    from trainlab.core.config import Params
    from trainlab.tracking.tracker import flatten_params

    p = Params.model_validate(params)
    auto = {f"auto.data.{k}" for k in model_info["meta"].get("auto", {})} | {
        f"auto.classifier.{k}" for k in model_info.get("auto", {})}
    return set(flatten_params({"base": p.base.model_dump(), "classifier": p.classifier.model_dump()})) | {
        "data_source", "world_size", "params_total", "params_trainable"} | auto


def test_four_processes_logging_at_once_to_the_default_sqlite_store_lose_nothing(tracked_runs):
    import mlflow

    root, runs = tracked_runs
    for code, output, _ in runs:
        assert code == 0, output[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")  # the default: mlflow.db in the stage's folder
    experiment = client.get_experiment_by_name("trainlab")
    found = client.search_runs([experiment.experiment_id], max_results=100)
    assert len(found) == CONCURRENT and all(r.info.status == "FINISHED" for r in found)
    by_id = {r.info.run_id: r for r in found}
    # the runs overlapped in time: they really wrote at once
    spans = sorted((r.info.start_time, r.info.end_time) for r in found)
    assert all(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans

    epoch_keys = {"epoch", "train_loss", "lr", "samples_per_s", "val_loss", "val_accuracy", "val_macro_f1"}
    final_keys = {"test_loss", "test_accuracy", "test_macro_f1", "params_total", "params_trainable", "epochs",
                  "train_time_s", "stage_time_s", "samples_per_s"}
    for i, (_, _, params) in enumerate(runs):
        info = {"run_id": json.loads((root / f"reports/classifier_{i}/run.json").read_text())["mlflow_run_id"]}
        run = by_id[info["run_id"]]
        model_info = json.loads((root / f"models/classifier_{i}/info.json").read_text())
        assert set(run.data.params) == expected_params(params, model_info), i
        assert run.data.params["auto.classifier.augment"] == model_info["auto"]["augment"]["value"] == "shift"
        assert run.data.params["base.seed"] == str(10 + i)
        assert set(run.data.metrics) == epoch_keys | final_keys
        epochs = params["classifier"]["epochs"]
        epoch_rows = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch")]
        assert [value for _, value in epoch_rows] == list(range(1, epochs + 1))  # one validation an epoch
        for key in epoch_keys - {"samples_per_s"}:  # MLflow's step: the optimizer step, as history.csv's
            assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [s for s, _ in epoch_rows]
        metrics = json.loads((root / f"reports/classifier_{i}/metrics.json").read_text())
        assert run.data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
        assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"environment.json", "history.csv"}
    versions = client.search_model_versions("name='trainlab-classifier'")
    assert sorted(v.run_id for v in versions) == sorted(by_id)


def test_unreachable_server_with_fallback_to_local_logs_to_the_local_store(tracked_runs):
    root, runs = tracked_runs
    code, output, _ = runs[FALLBACK_INDEX]
    assert code == 0
    warnings = [line for line in output.splitlines() if "unreachable" in line]
    assert len(warnings) == 1, output[-3000:]  # said once, not once per URI lookup
    assert warnings[0].startswith("warning: MLflow server http://alice:***@127.0.0.1:")
    assert f"logging to sqlite:///{root.resolve()}/mlflow.db instead" in warnings[0]
    assert URL_PASSWORD not in output
    info = {"run_id": json.loads((root / f"reports/classifier_{FALLBACK_INDEX}/run.json").read_text())["mlflow_run_id"]}
    assert info["run_id"]  # tracked: the run is one of the four counted in the local store
