"""prepare_text: data.text.max_length auto resolved from the training split, printed, and recorded where every later
reader (training, evaluate, predict, serving) takes it from; the schema default and params.yaml agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.factories import write_params
from trainlab.core.config import TextData, load_params
from trainlab.core.errors import ParamsError
from trainlab.data.inputs import load_contract
from trainlab.data.prepared import load_meta, load_split
from trainlab.data.tokenizer import AUTO_LENGTH_CAP, Tokenizer
from trainlab.jobs.prepare import prepare_text

REPO = Path(__file__).resolve().parents[2]
TOPICS = {"markets": "shares profit bank trading", "sport": "match goal team season", "tech": "chip software phone"}


def long_text_csv(path: Path, per_class: int = 20, words: int = 150) -> Path:
    """News-like articles of about `words` words (up to 2x), far longer than a tweet, in three topics."""
    lines = ["text,label"]
    for label, vocab in TOPICS.items():
        topic = vocab.split()
        for i in range(per_class):
            n = words + 7 * i  # every article a different length
            body = " ".join(f"{topic[j % len(topic)]} w{(i * 31 + j) % 97}" for j in range(n // 2))
            lines.append(f"\"{label} story {i}: {body}\",{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def text_params(tmp_path: Path, csv: Path, **text):
    section = {"text": {"source": "csv", "path": str(csv), "min_frequency": 1, **text}}
    return load_params(write_params(tmp_path / "params.yaml", section))


def test_the_schema_default_and_params_yaml_agree_on_data_text():
    assert TextData().max_length == "auto"
    assert load_params(REPO / "params.yaml").data.text == TextData()


def test_config_takes_auto_or_a_number_and_names_the_key_otherwise(tmp_path):
    assert load_params(write_params(tmp_path / "a.yaml", {"text": {"max_length": 64}})).data.text.max_length == 64
    assert load_params(write_params(tmp_path / "b.yaml", {"text": {"max_length": "auto"}})).data.text.max_length == \
        "auto"
    with pytest.raises(ParamsError, match=r"data\.text\.max_length"):
        load_params(write_params(tmp_path / "c.yaml", {"text": {"max_length": "longest"}}))


def test_auto_covers_long_texts_and_is_recorded_where_every_reader_looks(tmp_path):
    params = text_params(tmp_path, long_text_csv(tmp_path / "news.csv"))
    lines = []
    stats = prepare_text(params, tmp_path / "text", log=lines.append)
    folder = tmp_path / "text"
    meta = load_meta(folder)
    length = meta["max_length"]
    assert isinstance(length, int) and length % 8 == 0
    # the articles have 150..283 words plus the "label story i:" head: 48 tokens would have kept a sixth of them
    assert stats["token_length"]["train"]["max"] <= length < stats["token_length"]["train"]["max"] + 8
    assert stats["token_length"]["train"]["truncated_fraction"] <= 0.01 and stats["max_length"] == length
    assert meta["auto"]["max_length"]["value"] == length and "99% of the" in meta["auto"]["max_length"]["why"]
    assert any(line.startswith(f"text: max_length auto -> {length} (99% of the") for line in lines)
    # training builds the model from meta.json; predict and serving take it from the tokenizer file the input
    # contract (preprocessing.json) names, its one place there
    preprocessing = json.loads((folder / "preprocessing.json").read_text())
    assert preprocessing["text"] == {"cleaning": "whitespace", "tokenizer": "tokenizer.json"}
    assert load_contract(folder).tokenizer.max_length == Tokenizer.load(folder / "tokenizer.json").max_length == length
    for split in ("train", "val", "test"):
        assert load_split(folder, split)["tokens"].shape[1] == length


def test_auto_is_capped_for_very_long_documents(tmp_path):
    params = text_params(tmp_path, long_text_csv(tmp_path / "books.csv", per_class=8, words=1400))
    lines = []
    prepare_text(params, tmp_path / "text", log=lines.append)
    meta = load_meta(tmp_path / "text")
    assert meta["max_length"] == AUTO_LENGTH_CAP and "above the cap of 512" in meta["auto"]["max_length"]["why"]
    assert any("max_length auto -> 512" in line for line in lines)


def test_a_number_is_kept_and_records_no_auto(tmp_path):
    params = text_params(tmp_path, long_text_csv(tmp_path / "news.csv"), max_length=32)
    lines = []
    stats = prepare_text(params, tmp_path / "text", log=lines.append)
    meta = load_meta(tmp_path / "text")
    assert meta["max_length"] == 32 and meta["auto"] == {} and "auto" not in stats
    assert not any("max_length auto" in line for line in lines)
    assert stats["token_length"]["train"]["truncated_fraction"] == 1.0
