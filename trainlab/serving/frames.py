"""The DataFrame face of a Predictor (what the MLflow model takes and gives): a `text` column of strings or an
`image` column of encoded image bytes in; the label and one probability column per class (classifier, text), or
the mask PNG and one pixel-fraction column per class (segmenter) out. Bad rows are one DataError naming them."""

from __future__ import annotations

from typing import Any

import numpy as np

from trainlab.core.errors import DataError
from trainlab.serving.masks import pixel_fractions, png_bytes
from trainlab.serving.predictor import IMAGE_TASKS, Predictor

TEXT_COLUMN, IMAGE_COLUMN = "text", "image"
LABEL_COLUMN, MASK_COLUMN = "label", "mask_png"
PROBABILITY_PREFIX, FRACTION_PREFIX = "prob_", "fraction_"
FRAME_BATCH = 256  # rows per forward
SHOWN_ROWS = 10  # bad rows named in one message


def input_column(task: str) -> str:
    return IMAGE_COLUMN if task in IMAGE_TASKS else TEXT_COLUMN


def output_columns(task: str, class_names: list[str]) -> list[str]:
    if task == "segmenter":
        return [MASK_COLUMN, *(f"{FRACTION_PREFIX}{n}" for n in class_names)]
    return [LABEL_COLUMN, *(f"{PROBABILITY_PREFIX}{n}" for n in class_names)]


def raw_values(task: str, frame: Any) -> list[Any]:
    """The raw inputs of a DataFrame (or a dict of columns, or a list of values); DataError if the column the model
    takes is missing."""
    import pandas as pd

    column = input_column(task)
    if isinstance(frame, dict):
        frame = pd.DataFrame(frame)
    if isinstance(frame, (list, tuple, np.ndarray, pd.Series)):
        return list(frame)
    if not isinstance(frame, pd.DataFrame):
        raise DataError(f"expected a DataFrame with a {column!r} column, got {type(frame).__name__}")
    if column not in frame.columns:
        raise DataError(f"missing column {column!r} (got {', '.join(map(str, frame.columns)) or 'no columns'}); the "
                        f"{task} model takes {'encoded image bytes' if column == IMAGE_COLUMN else 'strings'} there")
    return list(frame[column])


def check_value(task: str, value: Any, where: str) -> Any:
    """An image must be its encoded bytes here (a server never opens paths it is sent)."""
    if task in IMAGE_TASKS and not isinstance(value, (bytes, bytearray, memoryview)):
        raise DataError(f"{where}: expected encoded image bytes (PNG, JPEG, ...; base64 in JSON), got "
                        f"{type(value).__name__} {value!r:.40}")
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


def predict_frame(predictor: Predictor, frame: Any) -> Any:
    """A DataFrame of outputs, one row per input row; every bad row named in one DataError (nothing predicted)."""
    import pandas as pd

    task = predictor.task
    values = raw_values(task, frame)
    names = [f"row {i}" for i in range(len(values))]
    rejected, items = [], []
    for i, value in enumerate(values):
        try:
            items.append(check_value(task, value, names[i]))
        except DataError as exc:
            rejected.append(str(exc))
            items.append(None)
    if rejected:
        raise_rejected(rejected, len(values))
    columns: dict[str, list[Any]] = {c: [] for c in output_columns(task, predictor.class_names)}
    for start, batch, bad in predictor.batches(items, names, FRAME_BATCH):
        rejected += [r.message for r in bad]
        if rejected:
            continue
        append_outputs(predictor, batch, columns)
    if rejected:
        raise_rejected(rejected, len(values))
    return pd.DataFrame(columns)


def append_outputs(predictor: Predictor, batch: Any, columns: dict[str, list[Any]]) -> None:
    names = predictor.class_names
    if batch.masks is not None:
        for mask in batch.masks:
            columns[MASK_COLUMN].append(png_bytes(mask))
            for name, fraction in zip(names, pixel_fractions(mask, len(names)).tolist()):
                columns[f"{FRACTION_PREFIX}{name}"].append(fraction)
        return
    columns[LABEL_COLUMN] += [names[i] for i in batch.labels.tolist()]
    probabilities = batch.probabilities.double().numpy()
    for c, name in enumerate(names):
        columns[f"{PROBABILITY_PREFIX}{name}"] += probabilities[:, c].tolist()


def raise_rejected(messages: list[str], total: int) -> None:
    shown = "; ".join(messages[:SHOWN_ROWS])
    more = f"; and {len(messages) - SHOWN_ROWS} more" if len(messages) > SHOWN_ROWS else ""
    raise DataError(f"{len(messages)} of {total} rows rejected: {shown}{more}")
