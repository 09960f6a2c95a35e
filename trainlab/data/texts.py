"""Text tables (CSV/TSV with chosen text and label columns) as labelled texts, and the documented text-cleaning rules.

Cleaning, applied to every text source:
1. whitespace runs become one space and the text is stripped (trainlab.data.inputs.clean_text: predict and the MLflow
   model clean each text they get the same way);
2. an empty text is an error naming its row (user data) - the embedded corpus has none;
3. exact duplicate texts (after rule 1) are dropped, keeping the first occurrence and its label,
   so one text cannot land in both the train and the test split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainlab.core.errors import DataError
from trainlab.data.input_files import read_table, require_column
from trainlab.data.inputs import clean_text


@dataclass
class LabeledTexts:
    """Texts with integer labels indexing `class_names`, plus what cleaning did."""

    texts: list[str]
    labels: np.ndarray
    class_names: list[str]
    source: str
    raw_rows: int
    dropped_duplicates: int = 0


def clean_texts(texts: Sequence[str], labels: np.ndarray,
                where: Callable[[int], str]) -> tuple[list[str], np.ndarray, int]:
    """Apply the cleaning rules; `where(i)` names row i in error messages. Returns texts, labels, duplicates dropped."""
    seen: set[str] = set()
    kept_texts, kept_rows = [], []
    for row, raw in enumerate(texts):
        text = clean_text(raw, where(row))
        if text in seen:
            continue
        seen.add(text)
        kept_texts.append(text)
        kept_rows.append(row)
    return kept_texts, np.asarray(labels)[kept_rows], len(texts) - len(kept_texts)


def sorted_class_names(values: Sequence[str]) -> list[str]:
    """Distinct labels, numerically sorted when all are integers, else alphabetically."""
    distinct = set(values)
    if all(v.lstrip("-").isdigit() for v in distinct):
        return sorted(distinct, key=int)
    return sorted(distinct)


def row_name(path: Path) -> Callable[[int], str]:
    """Rows are numbered like lines of the file: the header is row 1, the first data row is row 2."""
    return lambda i: f"{path}: row {i + 2}"


def read_labeled_texts(path: str | Path, text_column: str, label_column: str, delimiter: str) -> LabeledTexts:
    """A user's CSV/TSV (trainlab.data.input_files.read_table: a .tsv file is tab-separated) as cleaned texts with
    labels; class names are the distinct label values."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: text file not found (set data.text.path, or put the file there and `dvc add` it)")
    table = read_table(path, delimiter)
    require_column(table, text_column, path, "data.text.text_column")
    require_column(table, label_column, path, "data.text.label_column")
    if table.empty:
        raise DataError(f"{path}: no data rows below the header")
    where = row_name(path)
    raw_labels = [value.strip() for value in table[label_column]]
    for i, value in enumerate(raw_labels):
        if not value:
            raise DataError(f"{where(i)}: empty label in column {label_column!r}")
    class_names = sorted_class_names(raw_labels)
    index = {name: i for i, name in enumerate(class_names)}
    labels = np.array([index[value] for value in raw_labels], dtype=np.int64)
    texts, labels, dropped = clean_texts(list(table[text_column]), labels, where)
    return LabeledTexts(texts, labels, class_names, source="csv", raw_rows=len(table), dropped_duplicates=dropped)
