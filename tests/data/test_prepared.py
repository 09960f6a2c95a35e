"""The prepared format: safetensors splits and meta.json, byte-stable, with clear errors for missing or bad files."""

import pytest
import torch

from trainlab.core.errors import DataError
from trainlab.data.prepared import load_jsonl, load_meta, load_split, save_jsonl, save_meta, save_split, split_path


def tensors():
    return {"images": torch.arange(24, dtype=torch.uint8).reshape(2, 1, 3, 4), "labels": torch.tensor([0, 1])}


def test_round_trip_keeps_dtypes_and_values(tmp_path):
    save_split(tmp_path, "train", tensors())
    loaded = load_split(tmp_path, "train")
    assert loaded["images"].dtype == torch.uint8 and loaded["labels"].dtype == torch.int64
    assert all(torch.equal(loaded[k], v) for k, v in tensors().items())


def test_same_tensors_give_the_same_bytes(tmp_path):
    save_split(tmp_path / "a", "train", tensors())
    save_split(tmp_path / "b", "train", tensors())
    assert split_path(tmp_path / "a", "train").read_bytes() == split_path(tmp_path / "b", "train").read_bytes()


def test_missing_split_is_named(tmp_path):
    with pytest.raises(DataError, match=r"val\.safetensors: prepared split not found"):
        load_split(tmp_path, "val")


def test_corrupt_split_is_named(tmp_path):
    split_path(tmp_path, "test").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    with pytest.raises(DataError, match=r"test\.safetensors: not a readable safetensors file"):
        load_split(tmp_path, "test")


def test_meta_round_trip_and_errors(tmp_path):
    save_meta(tmp_path, {"num_classes": 3, "class_names": ["a", "b", "c"]})
    assert load_meta(tmp_path)["class_names"] == ["a", "b", "c"]
    with pytest.raises(DataError, match="meta.json: prepared metadata not found"):
        load_meta(tmp_path / "missing")


def test_jsonl_round_trip_survives_unicode_line_separators(tmp_path):
    rows = [{"text": "caf\u00e9 \u2028 next\x85line", "label": 1}, {"text": "plain", "label": 0}]
    path = save_jsonl(tmp_path / "t.jsonl", rows)
    assert path.read_bytes().isascii() and len(path.read_text().splitlines()) == 2
    assert load_jsonl(path) == rows
