"""The Tracker of a training stage: calls go through a bounded queue to a thread that opens the stage's run and makes
them, retrying through an outage of the server (while the run opens, too), so training never waits on it; when the
server is still away after the stage, the calls left are spooled and the stage exits 6."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlab.tracking import spool
from trainlab.tracking.outage import TrackingOutage, first_line, is_outage, refusal
from trainlab.tracking.runs import RunPlan, open_run, plan_run, run_status
from trainlab.tracking.secrets import redact
from trainlab.tracking.spool import Call
from trainlab.tracking.tracker import (
    MlflowTracker,
    NullTracker,
    artifact_file,
    check_model_call,
    flatten_params,
    metric_values,
    prepare_model_logging,
)
from trainlab.tracking.uri import configure_http, resolve_tracking_uri

if TYPE_CHECKING:
    from trainlab.core.config import Params, TrackingParams

_MAX_BACKOFF_S = 5.0


class RunOpener:
    """Opens a stage's run from its plan, which it makes on first use (on the queue's thread: importing MLflow takes
    about 1.5 s on a 2-core CPU); tried again after an outage, it takes the run an earlier try may have created."""

    def __init__(self, make_plan: Callable[[], RunPlan]) -> None:
        self._make_plan = make_plan
        self.plan: RunPlan | None = None
        self.tries = 0

    def __call__(self) -> MlflowTracker:
        if self.plan is None:
            self.plan = self._make_plan()
        self.tries += 1
        return open_run(self.plan, find_first=self.tries > 1)


class QueuedTracker:
    """The Tracker the training loop sees: every call is checked, put on a bounded queue and returns at once; a thread
    opens the run (`opener`) and then makes the calls, in order, on its MlflowTracker (`execute`). A server that does
    not answer, while the run opens or later, is waited for (the call kept and retried); one that refuses sets
    `failed` and `error`, and every later call raises that error."""

    def __init__(self, opener: Callable[[], Any], queue_size: int, execute: Callable[[Any, Call], None],
                 tracking_uri: str = "", prepare: Callable[[], None] | None = None) -> None:
        self._opener = opener
        self._prepare = prepare  # work done on the thread once the run is open, before the first call
        self._queue: queue.Queue[Call | None] = queue.Queue(maxsize=queue_size)  # None: finish()'s wake-up
        self._execute = execute
        self._seq = 0
        self._head: Call | None = None  # the call being made (kept until it succeeds)
        self._abort = threading.Event()
        self._end: Call | None = None
        self._settled = threading.Event()  # the run is open, or opening it met an outage or a refusal
        self.run: Any = None  # the open run's MlflowTracker
        self.tracking_uri = tracking_uri
        self.failed = threading.Event()
        self.error: BaseException | None = None  # what the server refused (stops the thread)
        self.dropped = 0
        self.outage_since: float | None = None
        self._thread = threading.Thread(target=self._work, name="trainlab-tracking-queue", daemon=True)
        self._thread.start()

    # -- the Tracker API (never blocks on a server that does not answer) -----------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id once it is open ('' while its server is away); waits for the opening while the server answers
        and raises what it refused."""
        return self._open_run_attribute("run_id")

    @property
    def experiment_id(self) -> str:
        return self._open_run_attribute("experiment_id")

    def settle(self) -> None:
        """Wait until the run is open, or opening it met a server that does not answer, or a refusal."""
        self._settled.wait()

    def _open_run_attribute(self, name: str) -> str:
        self.settle()
        if self.run is None and self.error is not None:
            raise self.error
        return getattr(self.run, name) if self.run is not None else ""

    def log_params(self, params: Any) -> None:
        self.put("log_params", params=flatten_params(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.put("log_metrics", metrics=metric_values(metrics, step), step=int(step or 0),
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
        self.put("log_artifact", path=str(artifact_file(path).resolve()), artifact_path=artifact_path)

    def log_model(self, model: Any, name: str, input_example: Any, registered_model_name: str | None = None,
                  model_dir: str | os.PathLike | None = None, raw_example: dict[str, list[Any]] | None = None,
                  tensor_model: bool = False) -> None:
        check_model_call(name, input_example)
        self.put("log_model", model=model, name=name, input_example=input_example,
                 registered_model_name=registered_model_name,
                 model_dir=None if model_dir is None else str(Path(model_dir).resolve()), raw_example=raw_example,
                 tensor_model=tensor_model)

    def put(self, method: str, /, **kwargs: Any) -> None:
        if self.error is not None:
            raise self.error
        self._seq += 1
        try:
            self._queue.put_nowait(Call(self._seq, method, kwargs))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                print(f"warning: {self._queue.maxsize} MLflow calls are waiting for the server "
                      "(tracking.queue_size); further calls are dropped until it catches up", file=sys.stderr)

    # -- the thread ------------------------------------------------------------------------------------------------

    def _work(self) -> None:
        delay = 0.5
        while self.run is None and not self._abort.is_set():
            if not self._attempt(self._open):
                return
            if self.run is None:
                self._abort.wait(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
        if self._prepare is not None and not self._abort.is_set():
            self._prepare()
        delay = 0.5
        while not self._abort.is_set():
            if self._head is None:
                self._head = self._next()
                if self._head is None:
                    continue
            if not self._attempt(lambda: self._execute(self.run, self._head)):
                return
            if self.outage_since is not None:  # still away: the same call again, a little later
                self._abort.wait(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                continue
            delay = 0.5
            done, self._head = self._head, None
            if done.name == "end_run":
                return

    def _open(self) -> None:
        self.run = self._opener()

    def _attempt(self, action: Callable[[], None]) -> bool:
        """Do `action`: True when it was done or the server did not answer (`outage_since` says which), False when the
        server refused (the thread stops)."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - sorted here: an outage is retried, anything else stops
            if not is_outage(exc):
                self.error = exc
                self.failed.set()
                self._settled.set()
                return False
            if self.outage_since is None:
                self.outage_since = time.monotonic()
                print(f"warning: MLflow server not answering ({first_line(exc, 160)}); training goes on, tracking "
                      "calls are kept and retried in the background", file=sys.stderr, flush=True)
            self._settled.set()
            return True
        self._settled.set()
        if self.outage_since is not None:
            print(f"note: MLflow server answering again after {time.monotonic() - self.outage_since:.0f} s; "
                  "the kept calls are being logged", file=sys.stderr, flush=True)
            self.outage_since = None
        return True

    def _next(self) -> Call | None:
        try:
            call = self._queue.get(timeout=0.2)
        except queue.Empty:
            call = None
        if call is not None:
            return call
        end, self._end = self._end, None  # the run's end comes after every call queued before it
        return end

    # -- the end ---------------------------------------------------------------------------------------------------

    def finish(self, status: str, grace_s: float, patience_s: float | None = None) -> bool:
        """Queue the run's end (`status`, after every call made so far), then wait for every call to be made: as
        long as the server answers, up to `grace_s` once it does not (and `patience_s` in all). True when all were
        (calls dropped because the queue was full were reported when they were dropped)."""
        self._seq += 1
        self._end = Call(self._seq, "end_run", {"status": status})
        try:  # wakes the thread as soon as the calls before it are made (rather than at its next 0.2 s poll)
            self._queue.put_nowait(None)
        except queue.Full:  # the thread has calls to make: it comes back to the queue soon enough
            pass
        started = time.monotonic()
        while self._thread.is_alive():
            self._thread.join(0.5)
            now = time.monotonic()
            if patience_s is not None and now - started > patience_s:
                break
            if self.outage_since is not None and now - started > grace_s and now - self.outage_since > grace_s:
                break
        return not self._thread.is_alive() and self.error is None

    def abandon(self, join_s: float) -> list[Call]:
        """Stop the thread (after the request in flight, at most `join_s`) and return the calls not yet made."""
        self._abort.set()
        self._settled.set()
        self._thread.join(join_s)
        left = [self._head] if self._head is not None else []
        while True:
            try:
                call = self._queue.get_nowait()
            except queue.Empty:
                break
            if call is not None:  # not finish()'s wake-up
                left.append(call)
        if self._end is not None:
            left.append(self._end)
        self._head = self._end = None
        return left


@contextmanager
def start_run_in_background(params: Params, stage: str, spool_key: str | None = None,
                            keep_outputs: Callable[[Path], None] | None = None, logs_model: bool = False,
                            **kwargs: Any) -> Iterator[QueuedTracker | NullTracker]:
    """A training stage's run (`trainlab.tracking.runs.start_run`'s arguments in `kwargs`), opened on a thread so that
    importing MLflow and opening the store overlap the stage's own start, and logged through a QueuedTracker. The
    stage's command line probed the server already (`probe_tracking`): a server that does not answer from here on is
    an outage, waited for; still away `tracking.outage_grace_s` after the body, the calls left are spooled under
    `spool_key` (with the stage's outputs, through `keep_outputs(spool folder)`) and TrackingOutage is raised (exit 6).

    The caller passes the tracker's ``failed`` event to the engine (`fit`'s stop), so that training stops at its next
    step (with a checkpoint to resume from) when the store refuses the run or a call; that refusal is what this
    raises then (exit 6). `logs_model`: the body will log a model; what that needs once per process is prepared on the
    thread while the body runs (trainlab.tracking.tracker.prepare_model_logging)."""
    if not params.tracking.enabled:
        yield NullTracker()
        return
    uri = resolve_tracking_uri(params)
    configure_http(params.tracking.request_timeout_s, params.tracking.request_retries)
    opener = RunOpener(lambda: plan_run(params, stage, uri, **kwargs))
    prepare = prepare_model_logging if logs_model else None
    with queued_run(opener, params.tracking, stage, spool_key, keep_outputs, uri, prepare) as tracker:
        yield tracker


@contextmanager
def queued_run(opener: RunOpener, tracking: TrackingParams, stage: str, spool_key: str | None = None,
               keep_outputs: Callable[[Path], None] | None = None, uri: str = "",
               prepare: Callable[[], None] | None = None) -> Iterator[QueuedTracker]:
    """A QueuedTracker for the run `opener` opens. When the body is done, wait for the queue: a refusal is raised
    (exit 6); a server that has not answered for `tracking.outage_grace_s` gets the calls left spooled under
    `spool_key` and TrackingOutage (exit 6)."""
    tracker = QueuedTracker(opener, tracking.queue_size, spool.execute, uri, prepare)
    try:
        yield tracker
    except BaseException as exc:
        _after_a_failed_body(tracker, exc, tracking)
        raise
    if tracker.finish("FINISHED", tracking.outage_grace_s):
        return
    if tracker.error is not None:  # the server answered, and refused: the run (if open) ends FAILED
        tracker.abandon(join_s=1)
        _end_run(tracker.run, "FAILED")
        raise _refused(tracker) from None
    left = tracker.abandon(join_s=1)
    if spool_key is None or (tracker.run is None and opener.plan is None):
        raise TrackingOutage(f"MLflow server {redact(uri)} did not answer for {tracking.outage_grace_s:g} s "
                             f"(tracking.outage_grace_s); {len(left)} tracking calls were not logged")
    raise _spooled(tracker, opener, left, stage, spool_key, keep_outputs, tracking)


def _after_a_failed_body(tracker: QueuedTracker, exc: BaseException, tracking: TrackingParams) -> None:
    """The body raised `exc`: a refusal (which stopped training) is raised instead; otherwise what was queued is
    logged and the run ended FAILED, without holding the failing stage long for a server that does not answer."""
    tracker.settle()
    if tracker.error is None and tracker.run is not None:
        if tracker.finish(run_status(exc), tracking.request_timeout_s, patience_s=2 * tracking.request_timeout_s):
            return
    left = tracker.abandon(join_s=1)
    if tracker.error is not None:
        if exc is not tracker.error:
            print(f"note: {exc}", file=sys.stderr)
        _end_run(tracker.run, run_status(exc))
        raise _refused(tracker) from None
    run = f"MLflow run {tracker.run.run_id}" if tracker.run is not None else "the MLflow run (never opened)"
    print(f"warning: {len(left)} tracking calls of {run} were not logged (the server did not answer)", file=sys.stderr)


def _refused(tracker: QueuedTracker) -> BaseException:
    what = "a call of MLflow run " + tracker.run.run_id if tracker.run is not None else "to open the run"
    return refusal(tracker.error, what, tracker.tracking_uri)


def _end_run(run: MlflowTracker | None, status: str) -> None:
    """Mark an open run `status` if the server lets us (best effort: it has refused something already)."""
    if run is None:
        return
    try:
        run.end(status)
    except Exception as exc:  # noqa: BLE001 - the error that matters is being raised
        if not is_outage(exc):
            print(f"warning: could not mark MLflow run {run.run_id} {status}: {first_line(exc)}", file=sys.stderr)


def _spooled(tracker: QueuedTracker, opener: RunOpener, left: list[Call], stage: str, spool_key: str,
             keep_outputs: Callable[[Path], None] | None, tracking: TrackingParams) -> TrackingOutage:
    """Spool the calls left (with the run, or the plan of a run never opened) and say so."""
    run = tracker.run
    record = {"stage": stage, "key": spool_key, "tracking_uri": tracker.tracking_uri,
              "run_id": run.run_id if run is not None else None,
              "experiment_id": run.experiment_id if run is not None else None,
              "register_models": run.register_models if run is not None else opener.plan.register_models,
              "plan": None if run is not None else opener.plan.to_dict()}
    folder = spool.write_spool(spool.spool_folder(stage, spool_key), record, left, keep_outputs)
    which = f"run {run.run_id}" if run is not None else f"the run {opener.plan.run_name!r} (never opened)"
    return TrackingOutage(
        f"MLflow server {redact(tracker.tracking_uri)} did not answer for {tracking.outage_grace_s:g} s after training "
        f"ended (tracking.outage_grace_s): the outputs are written; the {len(left)} tracking calls not yet made for "
        f"{which} are kept in {folder}. Once the server is back, `python -m trainlab.tracking.replay` logs them "
        "(so does the next run of this stage, without training again)")
