"""The local spool of a stage whose MLflow server went away: the calls not yet made, kept to be made later.

`.trainlab/spool/<stage>-<key>/` (outside every stage's outs: DVC removes those before it reruns a stage; ignored by
git and DVC) holds run.json (tracking URI, the run, or the plan of a run the server never let open), calls.jsonl (in
order), files/ (artifacts, the model) and done.txt (the last call made); the stage's own outputs/ beside them are
trainlab.jobs.outputs' business. Replaying opens a planned run (once: an earlier try's run is found by its plan's id)
and makes the calls left, each at most once in effect: metrics keep their timestamps (MLflow keeps one row per key,
step, time and value), params and tags are set to the same values, artifacts overwrite themselves, and a model is
logged and registered only if the run has no such model or version yet.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlab.core.atomic import atomic_dir, write_json, write_text
from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.outage import first_line, is_outage, refusal
from trainlab.tracking.registry import crown_if_none
from trainlab.tracking.retry import retry
from trainlab.tracking.runs import RunPlan, open_run
from trainlab.tracking.secrets import redact
from trainlab.tracking.tracker import MlflowTracker, exportable
from trainlab.tracking.uri import _probe_health, mlflow_client

SPOOL_ROOT = Path(".trainlab") / "spool"
SPOOLED_MODEL = "model"  # files/<seq>/model/: the model folder a raw-input (pyfunc) model is logged from
RAW_EXAMPLE = "raw_example.json"  # files/<seq>/raw_example.json: its raw input example (bytes as base64)
LOGGED = "logged"  # marker: every call was made; only the outputs are left for the stage's next run


def spool_folder(stage: str, key: str, root: Path = SPOOL_ROOT) -> Path:
    return Path(root) / f"{stage}-{key}"


@dataclass
class Call:
    """One tracking call: a Tracker method name and its keyword arguments, numbered in the order it was made."""

    seq: int
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------------
# Making a call (live from the queue, or replayed from the spool)


def execute(tracker: Any, call: Call) -> None:
    """Make `call` on an MlflowTracker, idempotently."""
    kw = call.kwargs
    if call.name == "log_metrics":
        tracker.log_metrics(kw["metrics"], step=kw["step"], timestamp_ms=kw["timestamp_ms"])
    elif call.name == "log_model":
        log_model_once(tracker, kw["model"], kw["name"], kw["input_example"], kw["registered_model_name"],
                       kw.get("model_dir"), kw.get("raw_example"), kw.get("tensor_model", False))
    elif call.name == "log_saved_model":
        from safetensors.torch import load_file

        from trainlab.tasks.saved import load_saved_model

        folder = Path(kw["folder"])
        model = load_saved_model(folder, kw["task"]).model
        example = load_file(str(folder / "input_example.safetensors"))["x"]
        # a spool written before raw-input models has no model/ copy: its model is logged tensor-level, as then
        model_dir = folder / SPOOLED_MODEL if (folder / SPOOLED_MODEL).is_dir() else None
        raw = read_raw_example(folder / RAW_EXAMPLE) if (folder / RAW_EXAMPLE).is_file() else None
        log_model_once(tracker, model, kw["name"], example, kw["registered_model_name"], model_dir, raw,
                       kw.get("tensor_model", False))
    elif call.name == "end_run":
        tracker.end(kw["status"])
    else:
        getattr(tracker, call.name)(**kw)


def log_model_once(tracker: Any, model: Any, name: str, example: Any, registered: str | None,
                   model_dir: str | Path | None = None, raw_example: dict[str, list[Any]] | None = None,
                   tensor_model: bool = False) -> None:
    """Log `model` under `name` unless the run already has a READY model of that name (a half-logged one is
    deleted first); register it unless the registered model already has a version from this run."""
    client = tracker._client
    found = retry(client.search_logged_models, experiment_ids=[tracker.experiment_id],
                   filter_string=f"source_run_id = '{tracker.run_id}' AND name = '{name}'")
    ready = [m for m in found if str(m.status) == "READY"]
    for half in (m for m in found if str(m.status) != "READY"):
        try:
            client.delete_logged_model(half.model_id)
        except Exception as exc:  # noqa: BLE001 - an outage is retried by the caller; anything else is cosmetic
            if is_outage(exc):
                raise
    if ready:
        model_id = ready[0].model_id
        tracker.last_model_uri = f"models:/{model_id}"
    else:
        tracker.log_model(model, name, example, registered_model_name=None, model_dir=model_dir,
                          raw_example=raw_example, tensor_model=tensor_model)
        model_id = tracker.last_model_uri.rsplit("/", 1)[-1]
    if not registered or not tracker.register_models:
        return
    versions = list(retry(client.search_model_versions, f"name = '{registered}' AND run_id = '{tracker.run_id}'"))
    if not versions:
        tracker._register(model_id, registered)
    else:  # registered before an outage cut the call short: the alias may not have been set
        crown_if_none(client, registered, str(versions[0].version))


# --------------------------------------------------------------------------------------------------------------------
# Writing and reading a spool


def write_spool(folder: Path, run: dict[str, Any], calls: Iterable[Call],
                keep_outputs: Callable[[Path], None] | None = None) -> Path:
    """Spool `calls` (files and models copied in) into `folder`, replacing it whole; `keep_outputs(folder)` adds the
    stage's outputs to the same atomic write (trainlab.jobs.outputs)."""
    with atomic_dir(folder) as tmp:
        records = [_serialise(call, tmp) for call in calls]
        if keep_outputs is not None:
            keep_outputs(tmp)
        (tmp / "calls.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        (tmp / "run.json").write_text(json.dumps({**run, "spooled_at": time.time()}, indent=2))
        (tmp / "done.txt").write_text("0\n")
    return folder


def _serialise(call: Call, root: Path) -> dict[str, Any]:
    kw = dict(call.kwargs)
    files = root / "files" / str(call.seq)
    if call.name == "log_artifact":
        src = Path(kw["path"])
        files.mkdir(parents=True)
        shutil.copytree(src, files / src.name) if src.is_dir() else shutil.copy2(src, files / src.name)
        kw["path"] = f"files/{call.seq}/{src.name}"
    elif call.name == "log_figure":
        artifact = Path(kw["artifact_file"] if Path(kw["artifact_file"]).suffix else kw["artifact_file"] + ".png")
        files.mkdir(parents=True)
        kw["fig"].savefig(files / artifact.name)
        parent = str(artifact.parent)
        return {"seq": call.seq, "name": "log_artifact",
                "kwargs": {"path": f"files/{call.seq}/{artifact.name}",
                           "artifact_path": None if parent == "." else parent}}
    elif call.name == "log_model":
        from safetensors.torch import save_file

        model, restore = exportable(kw["model"])
        try:
            files.mkdir(parents=True)
            save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()},
                      str(files / "model.safetensors"))
            (files / "config.json").write_text(json.dumps(model.config, indent=2, sort_keys=True))
        finally:
            restore()
        save_file({"x": kw["input_example"].detach().contiguous().cpu()}, str(files / "input_example.safetensors"))
        if kw.get("model_dir") and kw.get("raw_example") is not None and Path(kw["model_dir"]).is_dir():
            # what the raw-input (pyfunc) model needs: the model folder as the stage wrote it, and raw inputs
            shutil.copytree(kw["model_dir"], files / SPOOLED_MODEL)
            write_raw_example(files / RAW_EXAMPLE, kw["raw_example"])
        return {"seq": call.seq, "name": "log_saved_model",
                "kwargs": {"folder": f"files/{call.seq}", "task": kw["name"], "name": kw["name"],
                           "registered_model_name": kw["registered_model_name"],
                           "tensor_model": bool(kw.get("tensor_model", False))}}
    return {"seq": call.seq, "name": call.name, "kwargs": kw}


def write_raw_example(path: Path, example: dict[str, list[Any]]) -> None:
    columns = {name: [{"base64": base64.b64encode(v).decode("ascii")} if isinstance(v, bytes) else v for v in values]
               for name, values in example.items()}
    path.write_text(json.dumps(columns))


def read_raw_example(path: Path) -> dict[str, list[Any]]:
    columns = json.loads(path.read_text())
    return {name: [base64.b64decode(v["base64"]) if isinstance(v, dict) else v for v in values]
            for name, values in columns.items()}


def read_calls(folder: Path) -> list[Call]:
    """The spooled calls not yet made, with their file paths made absolute."""
    done = int((folder / "done.txt").read_text().strip() or 0) if (folder / "done.txt").exists() else 0
    calls = []
    for line in (folder / "calls.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record["seq"] <= done:
            continue
        kw = record["kwargs"]
        for key in ("path", "folder"):
            if key in kw:
                kw[key] = str(folder / kw[key])
        calls.append(Call(record["seq"], record["name"], kw))
    return calls


def read_run(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "run.json").read_text())


def is_logged(folder: Path) -> bool:
    return (folder / LOGGED).exists()


def pending_spools(root: Path = SPOOL_ROOT) -> list[Path]:
    """Spool folders under `root` with calls still to make."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "run.json").is_file() and not is_logged(p))


# --------------------------------------------------------------------------------------------------------------------
# Replaying


def replay(folder: Path) -> tuple[str, int]:
    """Open the spooled run if the server never let the stage open it, make the calls left, in order, recording each
    as done; mark the spool logged. Returns (run id, calls made). Raises TrackingUnavailable (exit 6) when the server
    still does not answer (what is left stays spooled) or refuses."""
    run = read_run(folder)
    calls = read_calls(folder)
    uri = run["tracking_uri"]
    if calls and uri.lower().startswith(("http://", "https://")):
        reason = _probe_health(uri, 10)
        if reason is not None:
            raise TrackingUnavailable(
                f"MLflow server {redact(uri)} is still unreachable ({reason}); {len(calls)} tracking calls of "
                f"{_which_run(run)} stay in {folder}: replay them with `python -m trainlab.tracking.replay` once it "
                "is back")
    tracker = _spooled_run(folder, run, len(calls))
    for made, call in enumerate(calls):
        try:
            execute(tracker, call)
        except Exception as exc:
            if not is_outage(exc):
                raise
            raise _still_away(uri, exc, len(calls) - made, run, folder) from None
        write_text(folder / "done.txt", f"{call.seq}\n")
    write_text(folder / LOGGED, "")
    return tracker.run_id, len(calls)


def _spooled_run(folder: Path, run: dict[str, Any], left: int) -> MlflowTracker:
    """The spool's run: opened from its plan (and recorded in run.json) when the stage never got it open."""
    uri = run["tracking_uri"]
    if run.get("run_id"):
        return MlflowTracker(mlflow_client(uri), run["run_id"], run["experiment_id"], uri, run["register_models"])
    try:
        tracker = open_run(RunPlan.from_dict(run["plan"]), find_first=True)
    except Exception as exc:
        if not is_outage(exc):
            raise refusal(exc, "to open the run", uri) from None
        raise _still_away(uri, exc, left, run, folder) from None
    write_json(folder / "run.json", {**run, "run_id": tracker.run_id, "experiment_id": tracker.experiment_id})
    return tracker


def _which_run(run: dict[str, Any]) -> str:
    return f"run {run['run_id']}" if run.get("run_id") else f"the run {run['plan']['run_name']!r} (not yet opened)"


def _still_away(uri: str, exc: BaseException, left: int, run: dict[str, Any], folder: Path) -> TrackingUnavailable:
    return TrackingUnavailable(
        f"MLflow server {redact(uri)} stopped answering during the replay ({first_line(exc)}); {left} tracking calls "
        f"of {_which_run(run)} stay in {folder}: replay them with `python -m trainlab.tracking.replay` once it is back")


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
