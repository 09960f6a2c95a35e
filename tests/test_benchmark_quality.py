"""The quality benchmark: default params on sliced real data sets in child processes (skipped with a reason when
../shared/data/quality is absent), missing data, the slices."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.quality import QUALITY_DATA, read_idx_gz, slice_class_folders, slice_csv, slice_idx, slice_pairs

REPO = Path(__file__).resolve().parents[1]
SETS = ("crackforest", "bbc_news", "cats_dogs")
MISSING_SLICED = [str(QUALITY_DATA / name) for name in ("cats_dogs", "crackforest", "text/bbc_news.csv")
                  if not (QUALITY_DATA / name).exists()]
FASHION_LABELS = QUALITY_DATA / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"


def run_quality(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("QUALITY_DATA", None)
    return subprocess.run([sys.executable, "-m", "benchmarks.quality", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(bool(MISSING_SLICED), reason=f"{', '.join(MISSING_SLICED)} not here (the shared quality data "
                    "sets sit beside the checkout in ../shared/data/quality, see its README)")
def test_sliced_data_sets_train_in_their_own_processes(tmp_path):
    proc = run_quality("--only-sets", ",".join(SETS), "--slice", "12", "--max-steps", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "quality.json").read_text())["rows"]}
    assert list(rows) == list(SETS)
    for name, row in rows.items():
        assert "error" not in row, row
        assert row["peak_rss_mib"] > 0 and row["train_time_s"] > 0 and row["samples_per_s"] > 0
        assert row["verdict"] in ("met", "MISSED")
        assert f"| {name} |" in proc.stdout
        assert f"[{name}]" in proc.stderr  # the child's progress streamed through
    assert rows["cats_dogs"]["samples"]["total"] == 24  # 12 per class folder
    assert rows["crackforest"]["samples"]["total"] == 12  # 12 image/mask pairs
    assert rows["bbc_news"]["samples"]["total"] == 60  # 12 rows of each of the 5 topics
    assert 0 <= rows["cats_dogs"]["test"]["accuracy"] <= 1
    assert 0 <= rows["crackforest"]["test"]["dice_foreground"] <= 1
    assert 0 <= rows["crackforest"]["test"]["iou_foreground"] <= 1
    text = rows["bbc_news"]
    assert 0 <= text["test"]["accuracy"] <= 1 and 0 <= text["baseline_accuracy"] <= 1
    assert text["verdict"] == ("met" if text["test"]["accuracy"] >= text["baseline_accuracy"] else "MISSED")


def test_missing_data_fails_and_names_the_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_quality("--only-sets", "cats_dogs,drive", "--data", str(empty), "--out", str(tmp_path))
    assert proc.returncode == 1
    assert str(empty / "cats_dogs") in proc.stderr and str(empty / "drive") in proc.stderr
    assert f"FAILED: missing: {empty / 'cats_dogs'}" in proc.stdout
    data = json.loads((tmp_path / "quality.json").read_text())
    assert data["failed"] == ["cats_dogs", "drive"]


def test_csv_slice_keeps_every_label(tmp_path):
    src, dst = tmp_path / "all.csv", tmp_path / "slice" / "all.csv"
    labels = ["a"] * 50 + ["b"] * 3 + ["c"] * 20
    with open(src, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows([f"text, \"{i}\"\nline two", label] for i, label in enumerate(labels))
    assert slice_csv(src, dst, 5) == {"a": 5, "b": 3, "c": 5}
    with open(dst, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["label"] for r in rows].count("b") == 3 and len(rows) == 13
    assert rows[0]["text"] == "text, \"0\"\nline two"  # quoting survives; the original order is kept


def test_folder_and_pair_slices_count_files(tmp_path):
    src = tmp_path / "classes"
    for name, count in (("cats", 7), ("dogs", 2)):
        (src / name).mkdir(parents=True)
        for i in range(count):
            (src / name / f"{i:02d}.jpg").write_bytes(b"x")
    (src / "cats" / ".DS_Store").write_bytes(b"x")
    assert slice_class_folders(src, tmp_path / "c", 5) == {"cats": 5, "dogs": 2}
    assert sorted(p.name for p in (tmp_path / "c" / "cats").iterdir()) == [f"{i:02d}.jpg" for i in range(5)]

    pairs = tmp_path / "pairs"
    for sub in ("images", "masks", "fov"):
        (pairs / sub).mkdir(parents=True)
    for i in range(6):
        (pairs / "images" / f"{i}.jpg").write_bytes(b"x")
        (pairs / "masks" / f"{i}.png").write_bytes(b"x")
    assert slice_pairs(pairs, tmp_path / "p", 4) == 4
    assert sorted(p.name for p in (tmp_path / "p" / "masks").iterdir()) == [f"{i}.png" for i in range(4)]
    assert not (tmp_path / "p" / "fov").exists()


def test_idx_slice_takes_the_first_samples_of_each_label(tmp_path):
    from benchmarks.quality import write_idx_gz
    from trainlab.data.torchvision_raw import MNIST_FILES

    src = tmp_path / "raw"
    src.mkdir()
    labels = np.array([0, 1, 1, 1, 2, 0, 1, 2, 2, 0], np.uint8)
    images = np.arange(10 * 28 * 28, dtype=np.int64).astype(np.uint8).reshape(10, 28, 28)
    for images_name, labels_name in MNIST_FILES.values():
        write_idx_gz(src / f"{labels_name}.gz", labels)
        write_idx_gz(src / f"{images_name}.gz", images)
    assert slice_idx(src, tmp_path / "out", 2) == {"train": 6, "test": 6}
    kept = [0, 1, 2, 4, 5, 7]  # the first two of each label, in their order
    assert read_idx_gz(tmp_path / "out" / "train-labels-idx1-ubyte.gz").tolist() == labels[kept].tolist()
    assert np.array_equal(read_idx_gz(tmp_path / "out" / "t10k-images-idx3-ubyte.gz"), images[kept])


@pytest.mark.skipif(not FASHION_LABELS.is_file(),
                    reason=f"{FASHION_LABELS} is not here (the shared quality data sets sit beside the checkout)")
def test_idx_reader_reads_the_shared_fashion_mnist_labels():
    labels = read_idx_gz(FASHION_LABELS)
    assert labels.shape == (10_000,) and np.bincount(labels).tolist() == [1000] * 10


@pytest.mark.skipif(bool(MISSING_SLICED), reason=f"{', '.join(MISSING_SLICED)} not here (the shared quality data "
                    "sets sit beside the checkout in ../shared/data/quality, see its README)")
def test_a_small_set_over_seeds_is_judged_on_the_mean_and_a_params_change_reaches_every_run(tmp_path):
    proc = run_quality("--only-sets", "cats_dogs", "--slice", "12", "--max-steps", "2", "--seeds", "1,2",
                       "--set", "classifier.patience=7", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "quality.json").read_text())
    row = data["rows"][0]
    assert data["settings"]["changes"] == {"classifier.patience": 7} and data["settings"]["seeds"] == [1, 2]
    assert list(row["seeds"]) == ["1", "2"]
    assert row["test"]["accuracy"] == pytest.approx(sum(row["seeds"].values()) / 2)
    assert row["spread"] == pytest.approx(max(row["seeds"].values()) - min(row["seeds"].values()))
    assert "for 7 validations" in str(row["resolved"]["epochs"])  # the patience reached the child's params
    assert "mean of seeds" in proc.stdout and "classifier.patience: 7" in proc.stdout


def test_seeds_repeat_the_sets_named_and_by_default_the_small_ones():
    from benchmarks.quality import SETS, parse_args

    assert parse_args(["--seeds", "1,2"]).repeat is None  # every set: the small ones repeated (SETS[...].small)
    assert parse_args(["--only-sets", "reuters_r8,embedded_text", "--seeds", "1,2"]).repeat == {"reuters_r8",
                                                                                               "embedded_text"}
    assert parse_args([]).sets == list(SETS)


def test_a_named_set_that_is_not_small_is_repeated_over_seeds_too(tmp_path):
    proc = run_quality("--only-sets", "embedded_text", "--quick", "--seeds", "1,2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "quality.json").read_text())["rows"][0]
    assert list(row["seeds"]) == ["1", "2"] and "baseline_accuracy" in row
    assert row["test"]["accuracy"] == pytest.approx(sum(row["seeds"].values()) / 2)
