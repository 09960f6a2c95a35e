"""A real `mlflow server` killed while a training stage runs: training goes on; back in time, the run ends complete;
gone for good, the stage writes its outputs, spools the calls, exits 6, and a replay or a rerun completes the run."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.processes import PYTHON, MlflowServer, free_port
from tests.reliability.conftest import make_workspace
from tests.reliability.factories import (
    CHECKPOINT,
    CLASSIFIER_ARGS,
    read_checkpoint,
    run_env,
    run_stage,
    stage_command,
    tiny_params,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration, pytest.mark.slow]

EPOCHS = 3
EPOCH_KEYS = ("epoch", "train_loss", "lr", "val_loss", "val_accuracy", "val_macro_f1")


@pytest.fixture
def server(tmp_path, migrated_db):
    root = tmp_path / "server"
    root.mkdir()
    shutil.copyfile(migrated_db, root / "server.db")
    srv = MlflowServer(root, free_port())
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory) -> Path:
    import mlflow

    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


class HealthOnly:
    """Answers the stage's first look at the server (`GET /health`, made before torch loads) and then goes away, so
    that the server is gone while the stage opens its run: the moment of the outage, made exact."""

    def __init__(self, port: int) -> None:
        answered = self.answered = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                self.send_response(200 if self.path == "/health" else 503)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")
                answered.set()

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def outage_params(uri: str, grace_s: float) -> dict:
    # width 8: TINY's width 4 crashes in backward with torch 2.14.1 on this CPU (segfault or heap corruption)
    return tiny_params({"classifier": {"epochs": EPOCHS, "checkpoint_every_steps": 0, "width": 8},
                        "tracking": {"enabled": True, "uri": uri, "request_timeout_s": 10, "request_retries": 0,
                                     "outage_grace_s": grace_s}})


def start_stage(ws: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(stage_command("stages.train_classifier", *CLASSIFIER_ARGS), cwd=ws, env=run_env(),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def epoch_done(ws: Path, epoch: int):
    def check():
        state = read_checkpoint(ws / CHECKPOINT)
        return state if state and state["epoch"] >= epoch else None
    return check


def the_run(uri: str):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    return client, run


def assert_complete(client, run, epochs: int = EPOCHS) -> None:
    """Every epoch's metrics once per step, the final metrics, the artifacts, one model, one registered version."""
    assert run.info.status == "FINISHED"
    # one validation an epoch, at MLflow steps that are the optimizer steps of the epochs' ends
    epoch_rows = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch")]
    assert [value for _, value in epoch_rows] == list(range(1, epochs + 1))
    steps = [step for step, _ in epoch_rows]
    assert steps == [steps[0] * e for e in range(1, epochs + 1)] and steps[0] > 1
    for key in EPOCH_KEYS:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == steps, key
    assert {"test_accuracy", "test_loss", "params_total", "stage_time_s"} <= set(run.data.metrics)
    assert run.data.params["classifier.epochs"] == str(epochs) and "params_total" in run.data.params
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"environment.json", "history.csv", "model_files"} <= artifacts
    models = client.search_logged_models([run.info.experiment_id])
    assert [(m.name, str(m.status), m.source_run_id) for m in models] == [("classifier", "READY", run.info.run_id)]
    versions = client.search_model_versions("name = 'trainlab-classifier'")
    assert [(v.version, v.run_id) for v in versions] == [("1", run.info.run_id)]


def test_server_killed_mid_training_and_back_later_the_run_ends_complete(tmp_path, prepared, server):
    ws = make_workspace(tmp_path / "ws", prepared, outage_params(server.uri, grace_s=120))
    log = tmp_path / "stage.log"
    proc = start_stage(ws, log)
    try:
        wait_until(epoch_done(ws, 1), proc, log, what="epoch 1 logged")
        server.stop()
        down = time.monotonic()
        # training goes on while the server is down: the next epoch ends (and is checkpointed) without it
        wait_until(epoch_done(ws, 2), proc, log, what="epoch 2 with the server down")
        server.start()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert time.monotonic() - down > 0
    assert "Traceback" not in output
    assert "warning: MLflow server not answering" in output and "answering again" in output
    assert (ws / "models/classifier/model.safetensors").exists() and not (ws / ".trainlab").exists()
    client, run = the_run(server.uri)
    assert_complete(client, run)
    info = {"run_id": json.loads((ws / "reports/classifier/run.json").read_text())["mlflow_run_id"]}
    assert info["run_id"] == run.info.run_id


def test_server_gone_for_good_exit_6_with_outputs_then_replay_and_rerun_complete_the_run(tmp_path, prepared, server):
    grace = 5
    ws = make_workspace(tmp_path / "ws", prepared, outage_params(server.uri, grace_s=grace))
    log = tmp_path / "stage.log"
    proc = start_stage(ws, log)
    try:
        wait_until(epoch_done(ws, 1), proc, log, what="epoch 1 logged")
        server.stop()
        metrics_file = ws / "reports/classifier/metrics.json"
        wait_until(metrics_file.exists, proc, log, timeout=600, what="training ended", interval=0.1)
        trained = time.monotonic()  # write_outputs writes metrics.json as soon as training and the test pass end
        proc.wait(timeout=grace + 60)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 6, output[-3000:]
    assert ended - trained <= grace + 10, f"exit {ended - trained:.1f} s after training ended"
    assert "Traceback" not in output
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "did not answer for 5 s after training ended" in error and "python -m trainlab.tracking.replay" in error
    for out in ("models/classifier/model.safetensors", "models/classifier/info.json", "reports/classifier/metrics.json",
                "reports/classifier/history.csv"):
        assert (ws / out).exists(), out
    [spool] = list((ws / ".trainlab/spool").iterdir())
    assert spool.name.startswith("train_classifier-")
    kept = [json.loads(line)["name"] for line in (spool / "calls.jsonl").read_text().splitlines()]
    assert kept[-2:] == ["log_saved_model", "end_run"] and "log_metrics" in kept

    # the server is still down: the replay says so in one line, exit 6, and keeps everything
    proc = subprocess.run([PYTHON, "-m", "trainlab.tracking.replay"], cwd=ws, env=run_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 6 and "still unreachable" in proc.stderr and "Traceback" not in proc.stderr
    assert (spool / "calls.jsonl").exists()

    server.start()
    backup = tmp_path / "spool-copy"
    shutil.copytree(spool, backup)
    proc = subprocess.run([PYTHON, "-m", "trainlab.tracking.replay"], cwd=ws, env=run_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"logged {len(kept)} calls" in proc.stdout
    client, run = the_run(server.uri)
    assert_complete(client, run)

    # idempotent: every call replayed a second time (as if the record of what was done were lost) lands nothing twice
    shutil.rmtree(spool)
    shutil.copytree(backup, spool)
    proc = subprocess.run([PYTHON, "-m", "trainlab.tracking.replay"], cwd=ws, env=run_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client, run = the_run(server.uri)
    assert_complete(client, run)

    # DVC removes a stage's outs before it reruns it: the rerun takes them from the spool, without a training step
    weights = (ws / "models/classifier/model.safetensors").read_bytes()
    shutil.rmtree(ws / "models")
    shutil.rmtree(ws / "reports")
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, ws, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no training" in proc.stdout and "epoch 1/" not in proc.stdout + proc.stderr
    assert (ws / "models/classifier/model.safetensors").read_bytes() == weights
    assert not spool.exists() and not (ws / CHECKPOINT).exists()
    client, run = the_run(server.uri)
    assert_complete(client, run)


def test_rerun_after_exit_6_completes_the_run_itself(tmp_path, prepared, server):
    """Without the replay command: the stage's next run (as `dvc repro` would start it, outs removed) replays."""
    ws = make_workspace(tmp_path / "ws", prepared, outage_params(server.uri, grace_s=2))
    log = tmp_path / "stage.log"
    proc = start_stage(ws, log)
    try:
        wait_until(epoch_done(ws, 1), proc, log, what="epoch 1 logged")
        server.stop()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 6, log.read_text()[-3000:]
    shutil.rmtree(ws / "models")
    shutil.rmtree(ws / "reports")
    server.start()
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, ws, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no training" in proc.stdout and "Traceback" not in proc.stderr
    assert (ws / "models/classifier/model.safetensors").exists() and (ws / "reports/classifier/metrics.json").exists()
    assert not (ws / ".trainlab/spool").exists() or not list((ws / ".trainlab/spool").iterdir())
    client, run = the_run(server.uri)
    assert_complete(client, run)


def stop_before_the_run_opens(tmp_path: Path, prepared: Path, port: int, grace_s: float):
    """A classifier stage whose server answers its first probe and is gone before its run opens: (workspace, stage
    process, log), the stage training without a server."""
    stub = HealthOnly(port)
    ws = make_workspace(tmp_path / "ws", prepared, outage_params(f"http://127.0.0.1:{port}", grace_s=grace_s))
    log = tmp_path / "stage.log"
    try:
        proc = start_stage(ws, log)
        wait_until(stub.answered.is_set, proc, log, what="the stage's probe of the server")
    finally:
        stub.stop()
    return ws, proc, log


def test_server_gone_while_the_run_opens_and_back_later_training_goes_on_and_the_run_ends_complete(
        tmp_path, prepared, migrated_db):
    """The hole the issue found: a server that stopped answering while the run was being opened stopped training at
    step 1 (exit 6). It is an outage like any other: training goes on, the run opens when the server is back."""
    root = tmp_path / "server"
    root.mkdir()
    shutil.copyfile(migrated_db, root / "server.db")
    server = MlflowServer(root, free_port())
    ws, proc, log = stop_before_the_run_opens(tmp_path, prepared, server.port, grace_s=120)
    try:
        wait_until(epoch_done(ws, 1), proc, log, what="epoch 1 with the server down from the start")
        server.start()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
        server.start()
    try:
        output = log.read_text()
        assert proc.returncode == 0, output[-3000:]
        assert "Traceback" not in output and "stopped at optimizer step" not in output
        assert "warning: MLflow server not answering" in output and "answering again" in output
        client, run = the_run(server.uri)
        assert_complete(client, run)
        # rewritten once the run has ended: the id of the run that opened late
        assert json.loads((ws / "reports/classifier/run.json").read_text())["mlflow_run_id"] == run.info.run_id
    finally:
        server.stop()


def test_server_gone_while_the_run_opens_for_good_exit_6_then_the_rerun_opens_and_completes_the_run(
        tmp_path, prepared, migrated_db):
    """Never back during the stage: the outputs are written, the calls spooled with the plan of the run that never
    opened (exit 6); the stage's next run opens that run and logs everything, without training again."""
    root = tmp_path / "server"
    root.mkdir()
    shutil.copyfile(migrated_db, root / "server.db")
    server = MlflowServer(root, free_port())
    ws, proc, log = stop_before_the_run_opens(tmp_path, prepared, server.port, grace_s=3)
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 6, output[-3000:]
    assert "Traceback" not in output and "stopped at optimizer step" not in output
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "(never opened)" in error and "did not answer for 3 s after training ended" in error
    [spool] = list((ws / ".trainlab/spool").iterdir())
    assert json.loads((spool / "run.json").read_text())["run_id"] is None
    weights = (ws / "models/classifier/model.safetensors").read_bytes()
    shutil.rmtree(ws / "models")  # as `dvc repro` does before it reruns the stage
    shutil.rmtree(ws / "reports")
    server.start()
    try:
        rerun = run_stage("stages.train_classifier", CLASSIFIER_ARGS, ws, timeout=300)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "no training" in rerun.stdout and "epoch 1/" not in rerun.stdout + rerun.stderr
        assert (ws / "models/classifier/model.safetensors").read_bytes() == weights and not spool.exists()
        client, run = the_run(server.uri)
        assert_complete(client, run)
        assert run.data.tags["stage"] == "train_classifier" and run.info.run_name.startswith("train_classifier")
    finally:
        server.stop()
