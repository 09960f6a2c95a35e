"""The local spool of a stage whose MLflow server went away: the calls not yet made, and a copy of its outputs.

`.trainlab/spool/<stage>-<key>/` (outside every stage's outs: DVC removes those before it reruns a stage; ignored by
git and DVC) holds run.json (tracking URI, run, outputs), calls.jsonl (in order), files/ (artifacts, the model),
outputs/ (copies of the stage's output folders) and done.txt (the last call made). Replaying makes the calls left,
each at most once in effect: metrics keep their timestamps (MLflow keeps one row per key, step, time and value),
params and tags are set to the same values, artifacts overwrite themselves, and a model is logged and registered
only if the run has no such model or version yet.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainlab.core.atomic import atomic_dir, atomic_path, write_text
from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.queue import Call, is_outage

SPOOL_ROOT = Path(".trainlab") / "spool"
SPOOLED_MODEL = "model"  # files/<seq>/model/: the model folder a raw-input (pyfunc) model is logged from
RAW_EXAMPLE = "raw_example.json"  # files/<seq>/raw_example.json: its raw input example (bytes as base64)
LOGGED = "logged"  # marker: every call was made; only the outputs are left for the stage's next run


def spool_folder(stage: str, key: str, root: Path = SPOOL_ROOT) -> Path:
    return Path(root) / f"{stage}-{key}"


# --------------------------------------------------------------------------------------------------------------------
# Making a call (live from the queue, or replayed from the spool)


def execute(tracker: Any, call: Call) -> None:
    """Make `call` on an MlflowTracker, idempotently."""
    from trainlab.tracking.retry import retry

    kw = call.kwargs
    if call.name == "log_metrics":
        tracker.log_metrics(kw["metrics"], step=kw["step"], timestamp_ms=kw["timestamp_ms"])
    elif call.name == "log_model":
        log_model_once(tracker, kw["model"], kw["name"], kw["input_example"], kw["registered_model_name"],
                       kw.get("model_dir"), kw.get("raw_example"))
    elif call.name == "log_saved_model":
        from safetensors.torch import load_file

        from trainlab.tasks.saved import load_saved_model

        folder = Path(kw["folder"])
        model = load_saved_model(folder, kw["task"]).model
        example = load_file(str(folder / "input_example.safetensors"))["x"]
        # a spool written before raw-input models has no model/ copy: its model is logged tensor-level, as then
        model_dir = folder / SPOOLED_MODEL if (folder / SPOOLED_MODEL).is_dir() else None
        raw = read_raw_example(folder / RAW_EXAMPLE) if (folder / RAW_EXAMPLE).is_file() else None
        log_model_once(tracker, model, kw["name"], example, kw["registered_model_name"], model_dir, raw)
    elif call.name == "end_run":
        retry(tracker._client.set_terminated, tracker.run_id, kw["status"])
    else:
        getattr(tracker, call.name)(**kw)


def log_model_once(tracker: Any, model: Any, name: str, example: Any, registered: str | None,
                   model_dir: str | Path | None = None, raw_example: dict[str, list[Any]] | None = None) -> None:
    """Log `model` under `name` unless the run already has a READY model of that name (a half-logged one is
    deleted first); register it unless the registered model already has a version from this run."""
    from trainlab.tracking.retry import retry

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
                          raw_example=raw_example)
        model_id = tracker.last_model_uri.rsplit("/", 1)[-1]
    if not registered or not tracker.register_models:
        return
    versions = retry(client.search_model_versions, f"name = '{registered}' AND run_id = '{tracker.run_id}'")
    if not list(versions):
        tracker._register(model_id, registered)


# --------------------------------------------------------------------------------------------------------------------
# Writing and reading a spool


def write_spool(folder: Path, run: dict[str, Any], calls: Iterable[Call], outputs: Iterable[Path]) -> Path:
    """Spool `calls` (files and models copied in) and copies of `outputs` into `folder`, replacing it whole."""
    outputs = [Path(p) for p in outputs]
    with atomic_dir(folder) as tmp:
        records = [_serialise(call, tmp) for call in calls]
        copies = {}
        for i, out in enumerate(outputs):
            if out.exists():
                dst = tmp / "outputs" / str(i)
                shutil.copytree(out, dst) if out.is_dir() else (dst.parent.mkdir(parents=True, exist_ok=True),
                                                                 shutil.copy2(out, dst))
                copies[str(out)] = f"outputs/{i}"
        (tmp / "calls.jsonl").write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        (tmp / "run.json").write_text(json.dumps({**run, "outputs": copies, "spooled_at": time.time()}, indent=2))
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
                "kwargs": {"path": f"files/{call.seq}/{artifact.name}", "artifact_path": None if parent == "." else parent}}
    elif call.name == "log_model":
        from safetensors.torch import save_file

        from trainlab.tracking.tracker import _exportable

        model, restore = _exportable(kw["model"])
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
                           "registered_model_name": kw["registered_model_name"]}}
    return {"seq": call.seq, "name": call.name, "kwargs": kw}


def write_raw_example(path: Path, example: dict[str, list[Any]]) -> None:
    import base64

    columns = {name: [{"base64": base64.b64encode(v).decode("ascii")} if isinstance(v, bytes) else v for v in values]
               for name, values in example.items()}
    path.write_text(json.dumps(columns))


def read_raw_example(path: Path) -> dict[str, list[Any]]:
    import base64

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
    """Make the spooled calls left, in order, recording each as done; mark the spool logged. Returns (run id, calls
    made). Raises TrackingUnavailable (exit 6) when the server still does not answer: what is left stays spooled."""
    from trainlab.tracking.secrets import redact
    from trainlab.tracking.tracker import MlflowTracker
    from trainlab.tracking.uri import _probe_health, mlflow_client

    run = read_run(folder)
    calls = read_calls(folder)
    uri = run["tracking_uri"]
    if calls and uri.lower().startswith(("http://", "https://")):
        reason = _probe_health(uri, 10)
        if reason is not None:
            raise TrackingUnavailable(
                f"MLflow server {redact(uri)} is still unreachable ({reason}); {len(calls)} tracking calls of run "
                f"{run['run_id']} stay in {folder}: replay them with `python -m trainlab.tracking.replay` once it is back")
    tracker = MlflowTracker(mlflow_client(uri), run["run_id"], run["experiment_id"], uri, run["register_models"])
    tracker.end_deferred = True
    for made, call in enumerate(calls):
        try:
            execute(tracker, call)
        except Exception as exc:
            if not is_outage(exc):
                raise
            raise TrackingUnavailable(
                f"MLflow server {redact(uri)} stopped answering during the replay ({_first_line(exc)}); "
                f"{len(calls) - made} tracking calls of run {run['run_id']} stay in {folder}: replay them with "
                "`python -m trainlab.tracking.replay` once it is back") from None
        write_text(folder / "done.txt", f"{call.seq}\n")
    write_text(folder / LOGGED, "")
    return run["run_id"], len(calls)


def restore_outputs(folder: Path, targets: list[Path]) -> None:
    """Put the spooled copies of the stage's outputs at `targets` (in the order they were spooled), atomically."""
    run = read_run(folder)
    for i, target in enumerate(targets):
        src = folder / "outputs" / str(i)
        if f"outputs/{i}" not in run["outputs"].values():
            continue
        if src.is_dir():
            with atomic_dir(target) as tmp:
                shutil.copytree(src, tmp, dirs_exist_ok=True)
        else:
            with atomic_path(target) as tmp:
                shutil.copy2(src, tmp)


def complete_stage(stage: str, key: str, outputs: list[Path], root: Path = SPOOL_ROOT) -> str | None:
    """If a run of `stage` with this `key` (same params and data) was spooled: replay what is left of it (exit 6 if
    the server still does not answer), put its outputs back and remove the spool. The MLflow run id, else None."""
    folder = spool_folder(stage, key, root)
    if not (folder / "run.json").is_file():
        return None
    run_id = read_run(folder)["run_id"] if is_logged(folder) else replay(folder)[0]
    restore_outputs(folder, outputs)
    remove(folder)
    return run_id


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]

