"""The predict command's body: a model folder or an MLflow model URI on image files, folders and globs, or on texts
from CSV/TSV files (or folders of them) or stdin, found and read by prepare's own reader (trainlab.data.input_files);
predictions written atomically into one folder, the inputs that could not be read listed (trainlab.serving does the
predicting, through the input contract)."""

from __future__ import annotations

import csv
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainlab.core.config import Params
from trainlab.core.errors import DataError, InputsRejected
from trainlab.data.input_files import (
    IMAGE_KINDS,
    IMAGE_SUFFIXES,
    TABLE_SUFFIXES,
    FoundFiles,
    find_files,
    read_table,
    require_column,
)
from trainlab.serving.predictor import IMAGE_TASKS, Predictor, Rejected

PREDICTIONS_FILE, FRACTIONS_FILE, REJECTED_FILE = "predictions.csv", "fractions.csv", "rejected.csv"
MASKS_DIR, OVERLAYS_DIR = "masks", "overlays"
URI_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/", "file:/", "s3://", "gs://", "http://", "https://")
SHOWN_REJECTED = 20  # bad inputs listed in the error message (all of them in rejected.csv)


@dataclass
class Inputs:
    """Raw inputs in order (image paths or texts), their names for messages and outputs, and those already bad."""

    items: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    skipped: int = 0  # files in folders and globs never read: hidden ones (.DS_Store, ._x.jpg), other suffixes

    def add(self, item: Any, name: str) -> None:
        self.items.append(item)
        self.names.append(name)

    def reject(self, name: str, message: str) -> None:
        self.rejected.append(Rejected(-1, name, message))

    def found(self, found: FoundFiles) -> list[tuple[Any, str]]:
        """Take what find_files reported missing and skipped; its (file, name) pairs."""
        for arg, message in found.missing:
            self.reject(arg, message)
        self.skipped += len(found.skipped.hidden) + len(found.skipped.not_images)
        return list(zip(found.files, found.names))


@dataclass
class PredictSummary:
    task: str
    predicted: int
    rejected: list[Rejected]
    out_dir: Path
    skipped: int = 0


# -- the model --------------------------------------------------------------------------------------------------------

def is_model_uri(model: str) -> bool:
    return model.startswith(URI_SCHEMES)


@contextmanager
def model_folder(model: str, params: Params) -> Iterator[Path]:
    """The trained model folder of MODEL: the folder itself, or the one inside an MLflow model (downloaded from the
    tracking store of params/MLFLOW_TRACKING_URI into a temp folder for the duration)."""
    if not is_model_uri(model):
        yield Path(model)
        return
    import mlflow

    from trainlab.core.errors import CheckpointError
    from trainlab.serving.flavor import model_folder as folder_in
    from trainlab.tracking.uri import global_tracking_uri, resolve_tracking_uri

    uri = resolve_tracking_uri(params)
    with tempfile.TemporaryDirectory(prefix="trainlab-predict-") as tmp, quiet_downloads():
        try:
            with global_tracking_uri(uri):
                local = mlflow.artifacts.download_artifacts(artifact_uri=model, dst_path=tmp, tracking_uri=uri)
        except Exception as exc:  # noqa: BLE001 - a missing model, alias or store: one message naming it
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise CheckpointError(f"{model}: could not be loaded from the MLflow store {uri} ({first})") from None
        yield folder_in(local, model)


@contextmanager
def quiet_downloads() -> Iterator[None]:
    """No per-file download bar from MLflow (the model holds a hundred small files)."""
    import os

    saved = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = saved


# -- inputs -----------------------------------------------------------------------------------------------------------

def image_inputs(args: list[str]) -> Inputs:
    """Image files, folders (their image files, recursively, sorted) and globs, in the order given; hidden files and
    files of other suffixes in folders and globs are skipped, as prepare skips them."""
    inputs = Inputs()
    for file, name in inputs.found(find_files(args, IMAGE_SUFFIXES, f"image files ({IMAGE_KINDS})")):
        inputs.add(file, name)
    return inputs


def text_inputs(args: list[str], params: Params, stdin: IO[str] | None) -> Inputs:
    """Texts from CSV/TSV files and folders of them (the column data.text.text_column names; read as prepare reads
    data.text.path) or, with no file or `-`, one per line of stdin. A file without that column, or unreadable, is
    rejected whole with the reason."""
    inputs = Inputs()
    column, delimiter = params.data.text.text_column, params.data.text.delimiter
    for arg in args or ["-"]:
        if arg == "-":
            for number, line in enumerate((stdin or sys.stdin).read().splitlines(), start=1):
                inputs.add(line, f"stdin: line {number}")
            continue
        for path, name in inputs.found(find_files([arg], TABLE_SUFFIXES, "CSV/TSV files (.csv, .tsv)")):
            try:
                table = read_table(path, delimiter)
                require_column(table, column, path, "data.text.text_column")
            except DataError as exc:
                inputs.reject(name, str(exc))
                continue
            for i, text in enumerate(table[column]):
                inputs.add(text, f"{name}: row {i + 2}")
    return inputs


# -- outputs ----------------------------------------------------------------------------------------------------------

def output_stem(name: str, used: set[str]) -> str:
    """A file name for an input's mask and overlay: its stem, made unique."""
    stem = Path(name).stem or "image"
    candidate, n = stem, 1
    while candidate in used:
        n += 1
        candidate = f"{stem}-{n}"
    used.add(candidate)
    return candidate


class Writer:
    """Writes one task's outputs into the staging folder, batch by batch."""

    def __init__(self, folder: Path, predictor: Predictor, top_k: int, texts: bool) -> None:
        self.folder, self.predictor, self.top_k = folder, predictor, top_k
        self.names = predictor.class_names
        self.used: set[str] = set()
        dense = predictor.dense
        self.file = open(folder / (FRACTIONS_FILE if dense else PREDICTIONS_FILE), "w", newline="", encoding="utf-8")
        self.csv = csv.writer(self.file)
        if dense:
            (folder / MASKS_DIR).mkdir()
            (folder / OVERLAYS_DIR).mkdir()
            self.csv.writerow(["input", "mask", *self.names])
        else:
            self.csv.writerow(["input", *(["text"] if texts else []), "label", "probability", "top_k"])
        self.texts = texts

    def write(self, items: list[Any], names: list[str], batch: Any) -> None:
        from PIL import Image

        from trainlab.serving.masks import overlay, pixel_fractions

        if not batch.indices:
            return
        if batch.masks is not None:
            for i, mask, image in zip(batch.indices, batch.masks, batch.images):
                stem = output_stem(names[i], self.used)
                Image.fromarray(mask).save(self.folder / MASKS_DIR / f"{stem}.png")
                Image.fromarray(overlay(image, mask)).save(self.folder / OVERLAYS_DIR / f"{stem}.png")
                fractions = pixel_fractions(mask, len(self.names))
                self.csv.writerow([names[i], f"{MASKS_DIR}/{stem}.png", *(f"{f:.6f}" for f in fractions)])
            return
        chosen = batch.probabilities.gather(1, batch.labels[:, None])[:, 0].tolist()
        top_p, top_i = batch.probabilities.topk(min(self.top_k, len(self.names)), dim=1)
        for i, label, p, ps, cs in zip(batch.indices, batch.labels.tolist(), chosen, top_p.tolist(), top_i.tolist()):
            text = [items[i]] if self.texts else []
            self.csv.writerow([names[i], *text, self.names[label], f"{p:.6f}",
                               "; ".join(f"{self.names[c]}:{q:.4f}" for c, q in zip(cs, ps))])

    def close(self) -> None:
        self.file.close()


def write_rejected(path: Path, rejected: list[Rejected]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["input", "error"])
        writer.writerows([r.name, r.message] for r in rejected)


def rejected_lines(rejected: list[Rejected]) -> str:
    lines = [f"  {r.message}" for r in rejected[:SHOWN_REJECTED]]
    if len(rejected) > SHOWN_REJECTED:
        lines.append(f"  ... and {len(rejected) - SHOWN_REJECTED} more")
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------------------------------------

def run_predict(model: str, args: list[str], out_dir: str | Path, params: Params, batch_size: int | None = None,
                top_k: int = 3, stdin: IO[str] | None = None, progress: bool = True) -> PredictSummary:
    """Predict `args` (images, folders, globs; or CSV/TSV files and stdin for text) with MODEL into `out_dir`,
    replaced whole. Bad inputs: the good ones are predicted and written, then InputsRejected (exit 8) lists the
    bad ones (also in rejected.csv); if no input is good, DataError (exit 3) and nothing is written."""
    from tqdm import tqdm

    from trainlab.core.atomic import atomic_dir
    from trainlab.core.runtime import resolve_runtime

    out_dir = Path(out_dir)
    runtime = resolve_runtime(params.base)
    batch_size = batch_size or params.evaluate.batch_size
    with model_folder(model, params) as folder:
        predictor = Predictor.load(folder, runtime)
    task = predictor.task
    inputs = image_inputs(args) if task in IMAGE_TASKS else text_inputs(args, params, stdin)
    if not inputs.items:
        detail = rejected_lines(inputs.rejected) if inputs.rejected else "  (none given)"
        raise DataError(f"no input to predict for the {task} model; nothing written:\n{detail}")
    rejected = list(inputs.rejected)
    predicted = 0
    show = progress and sys.stderr.isatty() and len(inputs.items) > batch_size
    with atomic_dir(out_dir) as staging, tqdm(total=len(inputs.items), desc=f"predict {task}", unit="input",
                                              disable=not show, file=sys.stderr) as bar:
        writer = Writer(staging, predictor, top_k, texts=task not in IMAGE_TASKS)
        try:
            for start, batch, bad in predictor.batches(inputs.items, inputs.names, batch_size, bar.update):
                end = start + batch_size
                writer.write(inputs.items[start:end], inputs.names[start:end], batch)
                predicted += len(batch.indices)
                rejected += bad
        finally:
            writer.close()
        if not predicted:
            raise DataError(f"none of the {len(rejected)} inputs could be predicted; nothing written:\n"
                            f"{rejected_lines(rejected)}")
        if rejected:
            write_rejected(staging / REJECTED_FILE, rejected)
    if rejected:
        raise InputsRejected(f"{len(rejected)} of {predicted + len(rejected)} inputs could not be predicted; the "
                             f"other {predicted} are in {out_dir} (the rejected ones in {out_dir / REJECTED_FILE}):\n"
                             f"{rejected_lines(rejected)}")
    return PredictSummary(task, predicted, rejected, out_dir, inputs.skipped)
