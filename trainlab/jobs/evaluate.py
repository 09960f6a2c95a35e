"""The evaluate stage: every registered task's model on its test split (trainlab.tasks: each task scores itself);
metrics, per-class and confusion data and pictures into reports/evaluate, and one MLflow run."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import torch

from trainlab.core.config import Params
from trainlab.core.errors import CheckpointError, DataError
from trainlab.core.flatten import numbers
from trainlab.core.runtime import Runtime
from trainlab.tasks import get, names
from trainlab.tasks.scoring import TaskInputs, TaskReport

# Output files under reports/evaluate (declared one by one in dvc.yaml). metrics.json holds each model's headline
# numbers (what `dvc exp show` compares); the per-class figures are plot data, one CSV per task.
METRICS_FILE = "metrics.json"
CONFUSION_MATRICES_FILE = "confusion_matrices.json"
TRAINING_CURVES_FILE = "training_curves.png"  # every model's training curves (from its info.json)


def per_class_file(name: str) -> str:
    return f"{name}_per_class.csv"


def confusion_file(name: str) -> str:
    return f"{name}_confusion.csv"


def output_files(tasks: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Every file the stage writes for these tasks (default: all registered)."""
    codes = {name: get(name).load() for name in (tasks or names())}
    return (METRICS_FILE, *(confusion_file(n) for n, c in codes.items() if c.confusion),
            *(per_class_file(n) for n in codes), CONFUSION_MATRICES_FILE, TRAINING_CURVES_FILE,
            *(f for c in codes.values() for f in c.pictures.values()))


def load_model(folder: Path, name: str, device: torch.device):
    """load_saved_model with every error naming a file inside `folder`."""
    from trainlab.tasks.saved import load_saved_model

    if not folder.is_dir():
        raise CheckpointError(f"{folder}: model folder not found (run `dvc repro train_{name}` first)")
    try:
        return load_saved_model(folder, name, device)
    except CheckpointError as exc:
        if str(folder) in str(exc):
            raise
        raise CheckpointError(f"{folder / 'config.json'}: {exc}") from None


def load_inputs(name: str, data_root: Path, models_root: Path, device: torch.device,
                max_in_memory_mb: int | None = None) -> TaskInputs:
    """Read models/<name> and the test split of its prepared data (in memory up to `max_in_memory_mb`, else its
    inputs read from disk a batch at a time); a mismatch is a clear error naming the files."""
    from trainlab.data.prepared import load_meta
    from trainlab.data.shards import open_split
    from trainlab.tasks.base import check_prepared

    spec = get(name)
    data_dir, model_dir = Path(data_root) / spec.data_folder, Path(models_root) / name
    meta = load_meta(data_dir)
    saved = load_model(model_dir, name, device)
    test = open_split(data_dir, "test", max_in_memory_mb, spec.load().streamable)
    test = {k: v.load() if not torch.is_tensor(v) and v.ndim == 1 else v for k, v in test.items()}  # labels in memory
    inputs = TaskInputs(name, saved.model, saved.config, saved.info, meta, test, model_dir, data_dir)
    check_model_matches_meta(inputs)
    check_same_preprocessing(name, data_dir, model_dir)
    check_prepared(spec, data_dir, meta, {"test": test})
    inputs.extra = inputs.code.load_extras(inputs)
    return inputs


def check_model_matches_meta(inputs: TaskInputs) -> None:
    meta_file, config_file = inputs.data_dir / "meta.json", inputs.model_dir / "config.json"
    missing = [k for k in get(inputs.name).meta_keys if k not in inputs.meta]
    if missing:
        raise DataError(f"{meta_file}: missing {', '.join(missing)} (rerun `dvc repro prepare`)")
    for key, want in inputs.code.expected_config(inputs.meta).items():
        have = inputs.config.get(key)
        if have != want:
            raise CheckpointError(
                f"{config_file}: the model has {key}={have} but {meta_file} says {want}; the model was not "
                f"trained on this data (rerun `dvc repro train_{inputs.name}`)")


def check_same_preprocessing(name: str, data_dir: Path, model_dir: Path) -> None:
    """The model takes its inputs the way this data was prepared: the input contracts (trainlab.data.inputs) of the
    data's and the model's preprocessing.json are equal (size, channels, resize policy, normalisation; tokenizer and
    cleaning). A folder without a record (data or a model from before them) is not compared."""
    from trainlab.data.inputs import load_contract
    from trainlab.data.preprocessing import PREPROCESSING_FILE

    data_file, model_file = data_dir / PREPROCESSING_FILE, model_dir / PREPROCESSING_FILE
    if not (data_file.is_file() and model_file.is_file()):
        return
    data_contract = load_contract(data_dir)
    try:
        model_contract = load_contract(model_dir)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if model_contract != data_contract:
        have, want = model_contract.describe(), data_contract.describe()
        detail = (f"the model takes {have}, but {data_file} prepares {want}" if have != want else
                  f"the model's tokenizer differs from the one of {data_file}")
        raise CheckpointError(f"{model_file}: {detail}; the model was not trained on this data (rerun "
                              f"`dvc repro train_{name}`)")


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["actual", "predicted"])
        writer.writeheader()
        writer.writerows(rows)


def write_pictures(folder: Path, name: str, pictures: dict[str, Any]) -> None:
    """A task's pictures, each drawn by trainlab.jobs.pictures.DRAW[kind] into the file its task names."""
    from trainlab.jobs import pictures as draw

    files = get(name).load().pictures
    for kind, data in pictures.items():
        draw.save_figure(draw.DRAW[kind](**data), folder / files[kind])


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """A task's metrics without the per-class dicts: what metrics.json keeps."""
    return {k: v for k, v in metrics.items() if not isinstance(v, dict)}


def per_class_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per class with its per-class figures (precision/recall, or IoU/Dice), for `dvc plots`."""
    vectors = {k: v for k, v in metrics.items() if isinstance(v, dict)}
    classes = list(next(iter(vectors.values()), {}))
    return [{"class": c, **{k: v[c] for k, v in vectors.items()}} for c in classes]


def write_reports(folder: Path, reports: dict[str, TaskReport]) -> dict[str, Any]:
    """metrics.json, the per-class and confusion CSVs, the matrices, and the PNGs, all into `folder`; returns
    every metric (per-class figures included)."""
    metrics = {name: report.metrics for name, report in reports.items()}
    (folder / METRICS_FILE).write_text(json.dumps({k: headline(v) for k, v in metrics.items()}, indent=2) + "\n")
    for name in reports:
        rows = per_class_rows(metrics[name])
        with open(folder / per_class_file(name), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    matrices = {name: r.confusion for name, r in reports.items() if r.confusion is not None}
    (folder / CONFUSION_MATRICES_FILE).write_text(json.dumps(matrices, indent=2) + "\n")
    for name, report in reports.items():
        if report.rows is not None:
            write_rows(folder / confusion_file(name), report.rows)
        write_pictures(folder, name, report.pictures)
    return metrics


def lineage_tags(inputs: dict[str, TaskInputs], tracker: Any = None) -> dict[str, str]:
    """`<task>_model_md5` and `<task>_run_id` of each evaluated model: the newest training run in the tracker's
    experiment tagged with that md5 (it also finds the run of a model DVC restored from its cache), else the
    `run_id` an older models/<task>/info.json recorded, else 'unknown'."""
    from trainlab.tracking.lineage import file_md5

    tags: dict[str, str] = {}
    for name, item in inputs.items():
        md5 = file_md5(item.model_dir / "model.safetensors")
        run_id = _training_run(tracker, name, md5) if getattr(tracker, "run_id", "") else None
        tags[f"{name}_model_md5"] = md5
        tags[f"{name}_run_id"] = str(run_id or item.info.get("run_id") or "unknown")
    return tags


def _training_run(tracker: Any, name: str, md5: str) -> str | None:
    from trainlab.tracking.uri import mlflow_client

    runs = mlflow_client(tracker.tracking_uri).search_runs(
        [tracker.experiment_id], filter_string=f"tags.model_md5 = '{md5}' and tags.stage = 'train_{name}'",
        order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def log_evaluation(params: Params, folder: Path, metrics: dict[str, Any], inputs: dict[str, TaskInputs],
                   runtime: Runtime) -> str:
    """One MLflow run for the evaluation (the test splits as its dataset inputs), tagged with the training runs it
    evaluated; returns its id."""
    from trainlab.tracking.lineage import split_inputs
    from trainlab.tracking.runs import start_run

    datasets = [d for i in inputs.values() for d in split_inputs(i.data_dir, ("test",))]
    with start_run(params, stage="evaluate", device=str(runtime.device), datasets=datasets) as tracker:
        tracker.set_tags(lineage_tags(inputs, tracker))
        tracker.log_params({"evaluate": params.evaluate.model_dump(), "base.seed": params.base.seed})
        tracker.set_tags(runtime.describe())
        tracker.log_metrics(numbers(metrics))
        for path in sorted(folder.iterdir()):
            tracker.log_artifact(path)
    return tracker.run_id


def run_evaluation(params: Params, data_root: str | Path, models_root: str | Path, out_dir: str | Path,
                   runtime: Runtime | None = None, tasks: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The evaluate stage for `tasks` (default: every registered task): every check before any output; `out_dir`
    is replaced whole only on success."""
    from trainlab.core.atomic import atomic_dir
    from trainlab.core.runtime import resolve_runtime
    from trainlab.jobs import pictures as draw

    runtime = runtime or resolve_runtime(params.base)
    tasks = tasks or names()
    inputs = {name: load_inputs(name, Path(data_root), Path(models_root), runtime.device,
                                params.base.data_on_device_max_mb) for name in tasks}
    reports = {name: item.code.evaluate(item, runtime, params) for name, item in inputs.items()}
    with atomic_dir(out_dir) as staging:
        metrics = write_reports(staging, reports)
        draw.save_figure(draw.training_curves({name: item.info for name, item in inputs.items()}),
                         staging / TRAINING_CURVES_FILE)
        if params.tracking.enabled:
            log_evaluation(params, staging, metrics, inputs, runtime)
    return metrics


def describe(metrics: dict[str, Any]) -> str:
    """A line per task for the terminal: its scalar metrics and test size."""
    lines = []
    for name, values in metrics.items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in values.items() if isinstance(v, float))
        lines.append(f"{name}: {shown} ({values.get('test_samples', '?')} test samples)")
    return "\n".join(lines)
