"""CSV/TSV text sources and the cleaning rules (whitespace, empty texts, duplicates)."""

import numpy as np
import pytest

from tests.data.factories import make_text_csv
from trainlab.core.errors import DataError
from trainlab.data.texts import clean_texts, read_labeled_texts, sorted_class_names


def test_csv_with_chosen_columns(tmp_path):
    data = read_labeled_texts(make_text_csv(tmp_path / "t.csv", per_class=4), "review", "sentiment", ",")
    assert data.class_names == ["bad", "good", "meh"]
    assert len(data.texts) == 12 == data.raw_rows and np.bincount(data.labels).tolist() == [4, 4, 4]


def test_tsv(tmp_path):
    path = make_text_csv(tmp_path / "t.tsv", per_class=3, delimiter="\t")
    data = read_labeled_texts(path, "review", "sentiment", "\t")
    assert len(data.texts) == 9


def test_integer_labels_sort_numerically():
    assert sorted_class_names(["10", "2", "1"]) == ["1", "2", "10"]
    assert sorted_class_names(["b", "a"]) == ["a", "b"]


def test_cleaning_collapses_whitespace_and_drops_duplicates():
    texts, labels, dropped = clean_texts(["  a  b ", "a b", "c"], np.array([0, 1, 2]), str)
    assert texts == ["a b", "c"] and labels.tolist() == [0, 2] and dropped == 1


def test_empty_text_names_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,label\nfine,a\n   ,b\n")
    with pytest.raises(DataError, match=r"t\.csv: row 3: empty text"):
        read_labeled_texts(path, "text", "label", ",")


def test_empty_label_names_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,label\nfine,a\nalso fine,\n")
    with pytest.raises(DataError, match=r"t\.csv: row 3: empty label in column 'label'"):
        read_labeled_texts(path, "text", "label", ",")


def test_missing_label_column_lists_the_columns(tmp_path):
    path = make_text_csv(tmp_path / "t.csv")
    with pytest.raises(DataError, match=r"t\.csv: column 'stars' not found .*columns are: review, sentiment"):
        read_labeled_texts(path, "review", "stars", ",")


def test_not_utf8_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"text,label\ncaf\xe9,a\n")
    with pytest.raises(DataError, match=r"t\.csv: not UTF-8"):
        read_labeled_texts(path, "text", "label", ",")
