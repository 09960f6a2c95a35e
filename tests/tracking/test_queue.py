"""The tracking queue: calls return at once, are made in order, retried through an outage (while the run opens too),
and spooled when it lasts; a refusal stops it; what counts as an outage; the spool's round trip. (The real-server
cases are in tests/reliability/test_outage.py.)"""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

import pytest
import requests
from mlflow.exceptions import MlflowException

from trainlab.jobs.outputs import keeper, restore
from trainlab.tracking.outage import is_outage
from trainlab.tracking.queue import QueuedTracker
from trainlab.tracking.spool import Call, read_calls, write_spool


def test_what_counts_as_an_outage():
    try:
        try:
            raise requests.ConnectionError("Connection refused")
        except requests.ConnectionError as inner:
            raise MlflowException(f"API request to http://x/api failed with exception {inner}") from None
    except MlflowException as wrapped:
        assert is_outage(wrapped)
    assert is_outage(MlflowException("API request to http://x failed with timeout exception Read timed out."))
    assert not is_outage(MlflowException("Changing param values is not allowed", error_code="INVALID_PARAMETER_VALUE"))
    assert not is_outage(MlflowException("No Experiment with id=3 exists", error_code="RESOURCE_DOES_NOT_EXIST"))
    assert not is_outage(ValueError("a bug"))


class FlakyServer:
    """Makes calls on behalf of the queue; refuses connections while `down` is set (the fault injected)."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.made: list[tuple[str, dict]] = []
        self.attempts = 0

    def execute(self, tracker, call: Call) -> None:
        self.attempts += 1
        if self.down.is_set():
            raise requests.ConnectionError("Connection refused")
        self.made.append((call.name, call.kwargs))


RUN = SimpleNamespace(run_id="r1", experiment_id="1", tracking_uri="http://x")


def opened() -> SimpleNamespace:
    return RUN


def test_calls_return_at_once_and_are_made_in_order_after_an_outage():
    server = FlakyServer()
    server.down.set()
    tracker = QueuedTracker(opened, queue_size=100, execute=server.execute)
    started = time.perf_counter()
    for step in range(1, 6):
        tracker.log_metrics({"loss": 1.0 / step}, step=step)
    tracker.set_tags({"a": "b"})
    assert time.perf_counter() - started < 0.1  # nothing waited for the server
    time.sleep(1.0)
    assert server.made == [] and server.attempts >= 2 and tracker.outage_since is not None
    server.down.clear()
    assert tracker.finish("FINISHED", grace_s=30)
    assert [name for name, _ in server.made] == ["log_metrics"] * 5 + ["set_tags", "end_run"]
    assert [kw["step"] for name, kw in server.made if name == "log_metrics"] == [1, 2, 3, 4, 5]
    assert not tracker.failed.is_set()


def test_prepare_runs_on_the_thread_once_the_run_is_open_and_before_the_first_call():
    server, seen = FlakyServer(), []

    def prepare():
        seen.append((threading.current_thread().name, list(server.made)))

    tracker = QueuedTracker(opened, queue_size=100, execute=server.execute, prepare=prepare)
    tracker.log_params({"a": 1})
    assert tracker.finish("FINISHED", grace_s=30)
    assert seen == [("trainlab-tracking-queue", [])]  # once, on the queue's thread, before any call was made
    assert [name for name, _ in server.made] == ["log_params", "end_run"]


def test_prepare_model_logging_builds_the_map_mlflow_checks_requirements_with(monkeypatch):
    """The head start fills MLflow's own cache; if MLflow renames it, this fails rather than the stage silently
    paying the 1.3 s at its end again."""
    from mlflow.utils import requirements_utils

    from trainlab.tracking.tracker import prepare_model_logging

    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    prepare_model_logging()
    assert "torch" in requirements_utils._MODULES_TO_PACKAGES["torch"]


def test_the_end_follows_every_call_queued_before_it_and_its_wake_up_is_no_call():
    server = FlakyServer()
    tracker = QueuedTracker(opened, queue_size=100, execute=server.execute)
    for step in range(1, 4):
        tracker.log_metrics({"loss": 1.0}, step=step)
    assert tracker.finish("FINISHED", grace_s=30)
    assert [name for name, _ in server.made] == ["log_metrics"] * 3 + ["end_run"]
    assert not tracker.abandon(join_s=1)  # finish()'s wake-up is not a call left over


def test_an_outage_longer_than_the_grace_leaves_the_calls_left_in_order():
    server = FlakyServer()
    tracker = QueuedTracker(opened, queue_size=100, execute=server.execute)
    tracker.log_params({"a": 1})
    deadline = time.monotonic() + 10
    while not server.made and time.monotonic() < deadline:
        time.sleep(0.05)
    server.down.set()
    tracker.log_metrics({"loss": 0.5}, step=1)
    tracker.log_text("hello", "notes.txt")
    started = time.monotonic()
    assert not tracker.finish("FINISHED", grace_s=1.0)
    assert time.monotonic() - started < 10
    left = tracker.abandon(join_s=1)
    assert [c.name for c in left] == ["log_metrics", "log_text", "end_run"]
    assert [c.seq for c in left] == sorted(c.seq for c in left)
    assert server.made == [("log_params", {"params": {"a": "1"}})]


def test_a_refused_call_stops_the_queue_and_sets_failed():
    def refuse(tracker, call):
        raise ValueError("INVALID_PARAMETER_VALUE: changing a param")

    tracker = QueuedTracker(opened, queue_size=10, execute=refuse)
    tracker.log_params({"a": 1})
    assert tracker.failed.wait(10)
    with pytest.raises(ValueError, match="changing a param"):
        tracker.log_metrics({"x": 1.0})


def test_the_spool_keeps_calls_and_files_and_gives_them_back_in_order(tmp_path):
    artifact = tmp_path / "history.csv"
    artifact.write_text("epoch,loss\n1,0.5\n")
    outputs = tmp_path / "reports"
    outputs.mkdir()
    (outputs / "metrics.json").write_text("{}")
    calls = [Call(3, "log_metrics", {"metrics": {"loss": 0.5}, "step": 1, "timestamp_ms": 123}),
             Call(4, "log_artifact", {"path": str(artifact), "artifact_path": None}),
             Call(5, "end_run", {"status": "FINISHED"})]
    folder = write_spool(tmp_path / "spool" / "train_x-key", {"run_id": "r1"}, calls, keeper(outputs))
    artifact.unlink()  # DVC would remove it before rerunning the stage: the spool has its own copy
    back = read_calls(folder)
    assert [(c.seq, c.name) for c in back] == [(3, "log_metrics"), (4, "log_artifact"), (5, "end_run")]
    assert back[0].kwargs["timestamp_ms"] == 123
    assert open(back[1].kwargs["path"]).read() == "epoch,loss\n1,0.5\n"
    (folder / "done.txt").write_text("4\n")
    assert [c.seq for c in read_calls(folder)] == [5]
    shutil.rmtree(outputs)  # as DVC does before it reruns the stage: its next run puts the outputs back
    restore(folder, [outputs])
    assert (outputs / "metrics.json").read_text() == "{}"


class OpensLater:
    """Opens the run once `up` is set; until then, the connection is refused (a server away while the run opens)."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.tries = 0

    def __call__(self) -> SimpleNamespace:
        self.tries += 1
        if not self.up.is_set():
            raise MlflowException("API request to http://x/api/2.0/mlflow/runs/create failed with exception "
                                  "HTTPConnectionPool(host='x', port=5000): Max retries exceeded (Connection refused)")
        return RUN


def test_a_server_away_while_the_run_opens_is_an_outage_training_goes_on_and_the_calls_follow(capfd):
    server, opener = FlakyServer(), OpensLater()
    tracker = QueuedTracker(opener, queue_size=100, execute=server.execute)
    for step in range(1, 4):
        tracker.log_metrics({"loss": 1.0 / step}, step=step)
    deadline = time.monotonic() + 10
    while opener.tries < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert opener.tries >= 2 and not tracker.failed.is_set()  # retried, never a reason to stop training
    assert tracker.run_id == "" and tracker.run is None  # no run yet, and asking does not wait for the server
    opener.up.set()
    assert tracker.finish("FINISHED", grace_s=30)
    assert tracker.run_id == "r1" and not tracker.failed.is_set()
    assert [kw["step"] for name, kw in server.made if name == "log_metrics"] == [1, 2, 3]
    assert server.made[-1] == ("end_run", {"status": "FINISHED"})
    err = capfd.readouterr().err
    assert "MLflow server not answering" in err and "answering again" in err


def test_a_refused_opening_sets_failed_and_every_call_raises_the_refusal():
    def refuse():
        raise MlflowException("No Experiment with id=7 exists", error_code="RESOURCE_DOES_NOT_EXIST")

    tracker = QueuedTracker(refuse, queue_size=10, execute=FlakyServer().execute)
    assert tracker.failed.wait(10)
    with pytest.raises(MlflowException, match="id=7"):
        tracker.log_metrics({"x": 1.0})
    with pytest.raises(MlflowException, match="id=7"):
        tracker.run_id
