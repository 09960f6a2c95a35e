"""The prepare stage: user data (PNG folders, CSV) and the embedded default end to end; bad input fails cleanly."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stages.prepare import main
from tests.data.factories import (
    SEG_CLASSES,
    make_fake_mnist,
    make_user_data,
    save_png,
    user_data_section,
    write_params,
)
from trainlab.core.cli import run_cli
from trainlab.core.errors import DataError
from trainlab.data.prepared import load_jsonl, load_meta, load_split
from trainlab.data.sources import embedded_digit_splits
from trainlab.data.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def user_data(tmp_path) -> Path:
    return make_user_data(tmp_path / "raw")


@pytest.fixture
def user_params(tmp_path, user_data) -> Path:
    return write_params(tmp_path / "params.yaml", user_data_section(user_data))


def run_stage(tmp_path: Path, params: Path) -> tuple[Path, Path]:
    out, stats = tmp_path / "out" / "prepared", tmp_path / "out" / "data_stats.json"
    main([str(out), str(stats), "--params", str(params)])
    return out, stats


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the user's own data -------------------------------------------------------------------------------------------

def test_prepare_user_png_folders_and_csv(tmp_path, user_params):
    out, stats_file = run_stage(tmp_path, user_params)
    stats = json.loads(stats_file.read_text())

    cls = load_split(out / "classification", "train")
    assert cls["images"].dtype == torch.uint8 and cls["images"].shape[1:] == (3, 8, 8)
    assert cls["labels"].dtype == torch.int64
    assert load_meta(out / "classification")["class_names"] == ["cat", "dog", "fox"]
    assert stats["classification"]["samples"] == {"train": 9, "val": 3, "test": 3, "total": 15}

    seg = {s: load_split(out / "segmentation", s) for s in ("train", "val", "test")}
    assert seg["train"]["masks"].dtype == torch.uint8 and seg["train"]["images"].shape[1:] == (1, 16, 16)
    assert sum(len(s["masks"]) for s in seg.values()) == 8
    assert load_meta(out / "segmentation")["num_classes"] == SEG_CLASSES

    text = load_split(out / "text", "train")
    meta = load_meta(out / "text")
    assert text["tokens"].shape[1] == 8 and (text["tokens"][:, 0] == meta["cls_id"]).all()
    assert meta["class_names"] == ["bad", "good", "meh"] and meta["counts"]["total"] == 18
    assert len(load_jsonl(out / "text" / "test.jsonl")) == meta["counts"]["test"]
    assert Tokenizer.load(out / "text" / "tokenizer.json").vocab_size == meta["vocab_size"]
    assert stats["text"]["token_length"]["train"]["max"] >= 2


def test_tokenizer_sees_only_training_texts(tmp_path, user_params):
    out, _ = run_stage(tmp_path, user_params)
    vocab = set(Tokenizer.load(out / "text" / "tokenizer.json").vocab)
    train_words = {w for row in load_jsonl(out / "text" / "train.jsonl") for w in row["text"].split()}
    held_out_only = {w for s in ("val", "test") for row in load_jsonl(out / "text" / f"{s}.jsonl")
                     for w in row["text"].split()} - train_words
    assert held_out_only and not (held_out_only & vocab)


def test_mnist_idx_source_keeps_the_official_test_set(tmp_path, user_data):
    section = user_data_section(user_data)
    section["classification"] = {"source": "mnist", "root": str(make_fake_mnist(tmp_path / "tv"))}
    out, stats_file = run_stage(tmp_path, write_params(tmp_path / "p.yaml", section))
    assert json.loads(stats_file.read_text())["classification"]["samples"] == {
        "train": 30, "val": 10, "test": 10, "total": 50}
    assert load_split(out / "classification", "test")["images"].shape == (10, 1, 28, 28)
    assert load_meta(out / "classification")["hflip"] is False  # a mirrored digit is not the same digit


def test_fashion_mnist_is_marked_mirror_safe(tmp_path, user_data):
    section = user_data_section(user_data)
    section["classification"] = {"source": "fashion_mnist",
                                 "root": str(make_fake_mnist(tmp_path / "tv", folder="FashionMNIST"))}
    out, _ = run_stage(tmp_path, write_params(tmp_path / "p.yaml", section))
    assert load_meta(out / "classification")["hflip"] is True  # training and TTA may mirror clothes


def test_stats_land_in_mlflow(tmp_path, user_data, tmp_mlflow):
    import mlflow

    params = write_params(tmp_path / "p.yaml", user_data_section(user_data), tracking=True)
    _, stats_file = run_stage(tmp_path, params)
    client = mlflow.MlflowClient(tmp_mlflow)
    [run] = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["stage"] == "prepare"
    assert run.data.metrics["classification.samples.total"] == 15
    stats = json.loads(stats_file.read_text())
    assert run.data.metrics["text.per_class.train.good"] == stats["text"]["per_class"]["train"]["good"]
    assert run.data.params["data.classification.source"] == "image_folder" and run.data.params["base.seed"] == "7"
    artifact = Path(client.download_artifacts(run.info.run_id, "data_stats.json", str(tmp_path)))
    assert json.loads(artifact.read_text()) == stats


# --- bad input: a clear error naming the file or row, non-zero exit, nothing written ------------------------------

def corrupt_image(root, data):
    (root / "seg" / "images" / "img_03.png").write_bytes(b"this is not a png")
    return r"images/img_03\.png: unreadable or corrupt image"


def truncated_image(root, data):
    path = root / "classes" / "dog" / "dog_1.png"
    path.write_bytes(path.read_bytes()[:60])
    return r"dog/dog_1\.png: unreadable or corrupt image"


def missing_image_folder(root, data):
    data["classification"]["root"] = str(root / "nowhere")
    return r"nowhere: image-folder dataset \(data\.classification\.root\) folder not found"


def missing_csv(root, data):
    data["text"]["path"] = str(root / "missing.csv")
    return r"missing\.csv: text file not found"


def missing_mask_folder(root, data):
    for mask in (root / "seg" / "masks").iterdir():
        mask.unlink()
    (root / "seg" / "masks").rmdir()
    return r"seg/masks: masks folder not found"


def mask_size_mismatch(root, data):
    save_png(root / "seg" / "masks" / "img_05.png", np.zeros((16, 15), np.uint8))
    return r"masks/img_05\.png: mask size 15x16 \(WxH\) does not match image .*img_05\.png size 16x16"


def mask_value_outside_classes(root, data):
    mask = np.zeros((16, 16), np.uint8)
    mask[0, 0] = 7
    save_png(root / "seg" / "masks" / "img_02.png", mask)
    return r"masks/img_02\.png: mask values \[7\] outside the classes 0\.\.2"


def label_column_missing(root, data):
    data["text"]["label_column"] = "stars"
    return r"texts\.csv: column 'stars' not found \(data\.text\.label_column\)"


def empty_text(root, data):
    path = root / "texts.csv"
    lines = path.read_text().splitlines()
    lines[4] = '"  ",good'
    path.write_text("\n".join(lines) + "\n")
    return r"texts\.csv: row 5: empty text"


def empty_class_folder(root, data):
    for image in (root / "classes" / "fox").iterdir():
        image.unlink()
    return r"classes/fox: class 'fox' has no samples"


def segmentation_class_never_in_masks(root, data):
    data["segmentation"]["num_classes"] = SEG_CLASSES + 1
    return r"seg/masks: class\(es\) 3 \(class_3\) have no samples"


def class_too_small_to_split(root, data):
    path = root / "texts.csv"
    path.write_text(path.read_text() + '"a lonely text",rare\n')
    return r"texts\.csv: class 'rare' has only 1 sample"


BAD_INPUTS = [corrupt_image, truncated_image, missing_image_folder, missing_csv, missing_mask_folder,
              mask_size_mismatch, mask_value_outside_classes, label_column_missing, empty_text, empty_class_folder,
              segmentation_class_never_in_masks, class_too_small_to_split]


@pytest.mark.parametrize("break_input", BAD_INPUTS, ids=lambda f: f.__name__)
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, user_data, break_input, capsys):
    data = user_data_section(user_data)
    expected = break_input(user_data, data)
    params = write_params(tmp_path / "params.yaml", data)
    out, stats = tmp_path / "out" / "prepared", tmp_path / "out" / "data_stats.json"
    argv = [str(out), str(stats), "--params", str(params)]

    with pytest.raises(DataError, match=expected):
        main(argv)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    assert exit_info.value.code == DataError.exit_code != 0
    assert "error: " in capsys.readouterr().err
    assert not out.exists() and not stats.exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temp folder left behind


def test_a_failed_run_keeps_the_previous_outputs(tmp_path, user_data, user_params):
    out, stats = run_stage(tmp_path, user_params)
    before = file_hashes(out)
    empty_text(user_data, {})
    with pytest.raises(DataError):
        run_stage(tmp_path, user_params)
    assert file_hashes(out) == before and stats.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["data_stats.json", "prepared"]


def test_command_line_exit_code_and_message(tmp_path, user_data):
    data = user_data_section(user_data)
    expected = missing_csv(user_data, data)
    params = write_params(tmp_path / "params.yaml", data)
    result = subprocess.run([sys.executable, "-m", "stages.prepare", str(tmp_path / "prepared"),
                             str(tmp_path / "stats.json"), "--params", str(params)],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == DataError.exit_code
    assert result.stderr.startswith("error: ") and re.search(expected, result.stderr)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "prepared").exists()


# --- the embedded default, end to end ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedded_runs(tmp_path_factory):
    """Two runs of the embedded prepare with the repo's data params (tracking off)."""
    tmp = tmp_path_factory.mktemp("embedded")
    params = write_params(tmp / "params.yaml", seed=42)
    return run_stage(tmp / "one", params), run_stage(tmp / "two", params)


def test_embedded_counts(embedded_runs):
    (out, stats_file), _ = embedded_runs
    stats = json.loads(stats_file.read_text())
    cls = stats["classification"]
    assert cls["samples"]["total"] == 5000
    assert [sum(cls["per_class"][s][d] for s in ("train", "val", "test")) for d in map(str, range(10))] == [500] * 10
    assert cls["samples"] == {"train": 3500, "val": 500, "test": 1000, "total": 5000}
    seg = stats["segmentation"]
    assert seg["samples"] == {"train": 3500, "val": 500, "test": 1000, "total": 5000}
    assert seg["num_classes"] == 11 and seg["height"] == seg["width"] == 48
    assert all(v > 0 for split in seg["pixel_fraction"].values() for v in split.values())
    text = stats["text"]
    assert text["raw_rows"] == 38158
    assert text["samples"]["total"] == 38158 - text["dropped_duplicates"]
    assert load_meta(out / "text")["class_names"] == ["negative", "neutral", "positive"]
    assert load_meta(out / "classification")["hflip"] is False and load_meta(out / "segmentation")["hflip"] is False


def test_embedded_tensors_follow_the_documented_layout(embedded_runs):
    (out, _), _ = embedded_runs
    cls = load_split(out / "classification", "test")
    assert cls["images"].shape == (1000, 1, 28, 28) and cls["images"].dtype == torch.uint8
    seg = load_split(out / "segmentation", "val")
    assert seg["images"].shape == (500, 1, 48, 48) and seg["masks"].shape == (500, 48, 48)
    assert seg["masks"].dtype == torch.uint8 and int(seg["masks"].max()) <= 10
    text = load_split(out / "text", "train")
    assert text["tokens"].dtype == torch.int64 and text["tokens"].shape[1] == load_meta(out / "text")["max_length"]
    assert (text["tokens"][:, 0] == 2).all()


def test_embedded_canvas_pools_are_the_classification_splits():
    from trainlab.core.config import Params
    from trainlab.data.embedded import load_mnist_5k

    _, labels = load_mnist_5k()
    pools = embedded_digit_splits(labels, Params().data, seed=42)
    assert not set(pools["test"]) & set(pools["train"]) and not set(pools["val"]) & set(pools["train"])


def test_two_runs_are_byte_identical(embedded_runs):
    (out1, stats1), (out2, stats2) = embedded_runs
    assert file_hashes(out1) == file_hashes(out2)
    assert stats1.read_bytes() == stats2.read_bytes()
