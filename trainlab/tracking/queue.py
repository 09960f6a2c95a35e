"""Tracking that never blocks training: calls go through a bounded queue to a thread that retries through outages."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.runs import PendingTracker

_MAX_BACKOFF_S = 5.0
# What MLflow's REST client says when the request never got an answer (it wraps the requests error in its message).
_OUTAGE_MARKERS = ("failed with exception", "failed with timeout exception", "max retries exceeded",
                   "connection refused", "connection aborted", "remote end closed", "read timed out",
                   "temporarily unavailable", "database is locked", "bad gateway", "service unavailable")


class TrackingOutage(TrackingUnavailable):
    """The MLflow server went away during the stage and did not come back within `tracking.outage_grace_s`."""


def configure_http(request_timeout_s: int, request_retries: int) -> None:
    """Bound each MLflow HTTP request (MLflow's defaults retry one request for minutes): read per request."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(request_timeout_s))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(request_retries))
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"


def is_outage(exc: BaseException) -> bool:
    """True when `exc` means "the server did not answer" (worth retrying later), not "the server said no"."""
    import requests

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
            return True
        text = str(current).lower()
        if any(marker in text for marker in _OUTAGE_MARKERS):
            return True
        if getattr(current, "error_code", "") in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass
class Call:
    """One tracking call: a Tracker method name and its keyword arguments, numbered in the order it was made."""

    seq: int
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


class QueuedTracker(PendingTracker):
    """The Tracker the training loop sees: every call is put on a bounded queue and returns at once; a thread makes
    the calls, in order, on the run's MlflowTracker once the run is open, retrying a call the server did not answer
    until it does. `failed` is set when the run cannot open or the server refuses a call."""

    def __init__(self, opening: Any, queue_size: int, execute: Any) -> None:
        super().__init__(opening)
        self._queue: queue.Queue[Call] = queue.Queue(maxsize=queue_size)
        self._execute = execute  # (MlflowTracker, Call) -> None
        self._seq = 0
        self._head: Call | None = None  # the call being made (kept until it succeeds)
        self._abort = threading.Event()
        self._end: Call | None = None
        self.error: BaseException | None = None  # what the server refused (stops the draining)
        self.dropped = 0
        self.outage_since: float | None = None
        self._thread = threading.Thread(target=self._drain, name="trainlab-tracking-queue", daemon=True)
        self._thread.start()

    # -- the Tracker API (never blocks on the server) --------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._opening.result().run_id

    @property
    def experiment_id(self) -> str:
        return self._opening.result().experiment_id

    @property
    def tracking_uri(self) -> str:
        return self._opening.result().tracking_uri

    def log_params(self, params: Any) -> None:
        from trainlab.tracking.tracker import flatten_params

        self.put("log_params", params=flatten_params(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.put("log_metrics", metrics={k: float(v) for k, v in metrics.items()}, step=int(step or 0),
                 timestamp_ms=int(time.time() * 1000))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.put("set_tags", tags=dict(tags))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self.put("log_dict", data=data, artifact_file=artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.put("log_text", text=text, artifact_file=artifact_file)

    def log_figure(self, fig: Any, artifact_file: str) -> None:
        self.put("log_figure", fig=fig, artifact_file=artifact_file)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        local = Path(path)
        if not local.exists():
            raise FileNotFoundError(f"cannot log artifact {local}: no such file or directory")
        self.put("log_artifact", path=str(local.resolve()), artifact_path=artifact_path)

    def log_model(self, model: Any, name: str, input_example: Any, registered_model_name: str | None = None,
                  model_dir: str | os.PathLike | None = None, raw_example: dict[str, list[Any]] | None = None) -> None:
        if input_example is None:
            raise ValueError(f"log_model({name!r}): an input_example (a small batch) is required to trace and "
                             "describe the model")
        self.put("log_model", model=model, name=name, input_example=input_example,
                 registered_model_name=registered_model_name,
                 model_dir=None if model_dir is None else str(Path(model_dir).resolve()), raw_example=raw_example)

    def put(self, method: str, /, **kwargs: Any) -> None:
        if self.error is not None:
            raise self.error
        if self._opening.done() and self.opening_error() is not None:
            raise self.opening_error()
        self._seq += 1
        try:
            self._queue.put_nowait(Call(self._seq, method, kwargs))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                print(f"warning: {self._queue.maxsize} MLflow calls are waiting for the server "
                      "(tracking.queue_size); further calls are dropped until it catches up", file=sys.stderr)

    # -- the draining thread ---------------------------------------------------------------------------------------

    def _next(self) -> Call | None:
        try:
            return self._queue.get(timeout=0.2)
        except queue.Empty:
            end, self._end = self._end, None  # the run's end comes after every call queued before it
            return end

    def _drain(self) -> None:
        try:
            tracker = self._opening.result()
        except BaseException:  # noqa: BLE001 - the opening error is reported by the caller
            return
        delay = 0.5
        while not self._abort.is_set():
            if self._head is None:
                self._head = self._next()
                if self._head is None:
                    continue
            try:
                self._execute(tracker, self._head)
            except Exception as exc:  # noqa: BLE001 - sorted below: an outage is retried, anything else stops
                if not is_outage(exc):
                    self.error = exc
                    self.failed.set()
                    return
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    line = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
                    print(f"warning: MLflow server not answering ({line}); training goes on, tracking calls are "
                          "kept and retried in the background", file=sys.stderr, flush=True)
                self._abort.wait(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                continue
            if self.outage_since is not None:
                print(f"note: MLflow server answering again after {time.monotonic() - self.outage_since:.0f} s; "
                      "the kept calls are being logged", file=sys.stderr, flush=True)
                self.outage_since = None
            delay = 0.5
            done, self._head = self._head, None
            if done.name == "end_run":
                return

    def finish(self, status: str, grace_s: float, patience_s: float | None = None) -> bool:
        """Queue the run's end (`status`, after every call made so far), then wait for every call to be made: as
        long as the server answers, up to `grace_s` once it does not (and `patience_s` in all). True when all were."""
        self._seq += 1
        self._end = Call(self._seq, "end_run", {"status": status})
        started = time.monotonic()
        while self._thread.is_alive():
            self._thread.join(0.5)
            now = time.monotonic()
            if patience_s is not None and now - started > patience_s:
                break
            if self.outage_since is not None and now - started > grace_s and now - self.outage_since > grace_s:
                break
        return not self._thread.is_alive() and self.error is None and self.dropped == 0

    def abandon(self, join_s: float) -> list[Call]:
        """Stop the thread (after the request in flight, at most `join_s`) and return the calls not yet made."""
        self._abort.set()
        self._thread.join(join_s)
        left = [self._head] if self._head is not None else []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if self._end is not None:
            left.append(self._end)
        self._head = self._end = None
        return left


def _open_with_deferred_end(opening: Any) -> Any:
    tracker = opening.__enter__()
    tracker.end_deferred = True  # the queue ends the run, after every call made before the end
    return tracker


def _status(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "KILLED"
    return "FINISHED" if isinstance(exc, SystemExit) and exc.code in (None, 0) else "FAILED"


@contextmanager
def queued_run(opening: Any, tracking: Any, stage: str, spool_key: str | None = None,
               outputs: tuple[Path, ...] = ()) -> Iterator[QueuedTracker]:
    """Open `opening` (a `start_run` context) on a thread and yield a QueuedTracker for it. When the body is done,
    wait for the queue; if the server has not answered for `tracking.outage_grace_s`, spool the calls left (and
    copies of `outputs`) under `spool_key` and raise TrackingOutage (exit 6)."""
    from trainlab.tracking import spool
    from trainlab.tracking.secrets import redact

    pool = ThreadPoolExecutor(1, thread_name_prefix="trainlab-tracking")
    tracker = QueuedTracker(pool.submit(_open_with_deferred_end, opening), tracking.queue_size, spool.execute)
    pool.shutdown(wait=False)
    try:
        yield tracker
    except BaseException as exc:
        error = tracker.opening_error()
        if error is not None:
            if exc is not error:
                print(f"note: {exc}", file=sys.stderr)
            if is_outage(error) and not isinstance(error, TrackingUnavailable):
                first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
                raise TrackingUnavailable(f"the MLflow server stopped answering while the run was being opened "
                                          f"({first}); start it again and rerun (training resumes from the "
                                          "checkpoint)") from None
            raise error from None
        # The run is open: log what was queued and end it FAILED, but do not hold a failing stage for long.
        if not tracker.finish(_status(exc), tracking.request_timeout_s, patience_s=2 * tracking.request_timeout_s):
            left = tracker.abandon(join_s=1)
            why = f"the server refused a call: {tracker.error}" if tracker.error else "the server did not answer"
            if tracker.error is not None:  # the server answers: start_run ends the run itself
                tracker.wait().end_deferred = False
            print(f"warning: {len(left)} tracking calls of MLflow run {tracker.run_id} were not logged ({why})",
                  file=sys.stderr)
        opening.__exit__(type(exc), exc, exc.__traceback__)
        raise
    if tracker.finish("FINISHED", tracking.outage_grace_s):
        opening.__exit__(None, None, None)
        return
    if tracker.error is not None:  # the server answered, and refused a call: the run ends FAILED with that error
        tracker.abandon(join_s=1)
        run = tracker.wait()
        run.end_deferred = False
        opening.__exit__(type(tracker.error), tracker.error, tracker.error.__traceback__)
        raise tracker.error
    left = tracker.abandon(join_s=1)
    run = tracker.wait()
    opening.__exit__(None, None, None)  # the end is deferred: nothing is sent
    if spool_key is None:
        raise TrackingOutage(f"MLflow server {redact(run.tracking_uri)} did not answer for "
                             f"{tracking.outage_grace_s:g} s (tracking.outage_grace_s); {len(left)} tracking calls "
                             f"of run {run.run_id} were not logged")
    folder = spool.write_spool(spool.spool_folder(stage, spool_key), {
        "stage": stage, "key": spool_key, "tracking_uri": run.tracking_uri, "run_id": run.run_id,
        "experiment_id": run.experiment_id, "register_models": run.register_models}, left, outputs)
    raise TrackingOutage(
        f"MLflow server {redact(run.tracking_uri)} did not answer for {tracking.outage_grace_s:g} s after training "
        f"ended (tracking.outage_grace_s): the outputs are written; the {len(left)} tracking calls not yet made for "
        f"run {run.run_id} are kept in {folder}. Once the server is back, `python -m trainlab.tracking.replay` logs them "
        "(so does the next run of this stage, without training again)")
