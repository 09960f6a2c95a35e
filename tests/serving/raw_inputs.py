"""The same raw files for every path of the input contract (tests/serving/test_input_contract.py and the server test):
photos in every encoding and size the folder tests use (tests/data/factories.py), digits, a segmentation folder,
text tables with a UTF-8 byte-order mark, tabs and UTF-16, and the files a Mac or Windows leaves beside them (._x
resource forks, .DS_Store, Thumbs.db); and what the predict command makes of them. Built once per session."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.data.factories import PHOTO_KINDS, SUFFIX, random_crop_of, sample_photos, save_png, write_photo
from tests.serving.workspace import TASK_FOLDERS, trained_workspace

CLASSES = ("3", "7")  # class folders of the raw digits (two of the model's ten classes)
SEG_LARGER = ((40, 48, "jpeg"), (64, 64, "webp"))  # segmentation images larger than the model's 32x32, stretched
APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + b"\x00" * 64  # what a ._x file holds
TEXT_ROWS = [  # (label, raw text): whitespace runs, quotes, commas and non-ASCII, each text once
    ("positive", "I  love\tthis  phone, really!"), ("negative", "what a sad,  sad day"),
    ("neutral", "the bus leaves at 9"), ("positive", "Café crème au soleil ☀️ #happy @friend"),
    ("negative", "  worst \"service\" ever  "), ("neutral", "meeting moved to https://example.com/x"),
    ("positive", "best day of the year"), ("negative", "I hate waiting in line"), ("neutral", "ok then"),
]
_BUILT: dict[str, Any] = {}


@dataclass
class RawCase:
    """The trained workspace, the raw input folders per task, and the predict command's outputs on them."""

    root: Path  # the trained workspace (tests/serving/workspace.py)
    params: Path  # its params with the served model's runtime (fp32, no channels_last: its last digits follow it)
    raw: dict[str, Path]  # task -> the folder prepare's reader is given (data.*.root, or the tables' folder)
    predicted: dict[str, Path] = field(default_factory=dict)  # task -> the predict command's --out folder

    def given(self, task: str) -> str:
        """What the predict command is given: the folder itself, or a segmentation folder's images/."""
        return str(self.raw[task] / "images" if task == "segmenter" else self.raw[task])

    def rows(self, task: str) -> list[dict[str, str]]:
        name = "fractions.csv" if task == "segmenter" else "predictions.csv"
        with open(self.predicted[task] / name, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def masks(self) -> list[np.ndarray]:
        """The segmenter's masks the command wrote, in input order."""
        return [np.asarray(Image.open(self.predicted["segmenter"] / r["mask"])) for r in self.rows("segmenter")]


def junk_beside(folder: Path, resource_fork_of: str) -> None:
    """What copying from a Mac or Windows leaves: a ._ resource fork (not an image), .DS_Store and Thumbs.db."""
    (folder / f"._{resource_fork_of}").write_bytes(APPLE_DOUBLE)
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (folder / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")


def write_classifier_files(root: Path, folder: Path) -> None:
    """Photo crops of every size in every encoding, and test digits as PNG, JPEG and PGM, in class folders."""
    from safetensors.torch import load_file

    rng = np.random.default_rng(11)
    photos = list(sample_photos().values())
    for i, kind in enumerate(PHOTO_KINDS):
        crop = random_crop_of(photos[i % 2], rng)
        write_photo(folder / CLASSES[i % 2] / f"photo_{i:02d}{SUFFIX[kind]}", crop, kind)
    digits = load_file(str(root / "data/prepared/classification/test.safetensors"))["images"][:6, 0].numpy()
    for i, digit in enumerate(digits):
        target = folder / CLASSES[i % 2] / f"digit_{i}{('.png', '.jpg', '.pgm')[i % 3]}"
        Image.fromarray(digit).save(target, **({"quality": 90} if target.suffix == ".jpg" else {}))
    junk_beside(folder / CLASSES[0], "photo_00.jpg")


def write_segmenter_files(folder: Path) -> None:
    """images/ and masks/: the model's own 32x32 size in every encoding, and a few larger images; masks of every
    class as rectangles at each image's upright size."""
    rng = np.random.default_rng(12)
    photo = sample_photos()["flower"]
    sizes = [(32, 32, kind) for kind in PHOTO_KINDS] + list(SEG_LARGER)
    for i, (height, width, kind) in enumerate(sizes):
        pixels = np.asarray(Image.fromarray(random_crop_of(photo, rng)).resize((width, height)))
        write_photo(folder / "images" / f"s{i:02d}{SUFFIX[kind]}", pixels, kind)
        mask = np.zeros((height, width), np.uint8)
        for c in range(1, 11):
            top, left = rng.integers(0, height - 6), rng.integers(0, width - 6)
            mask[top:top + 6, left:left + 6] = c
        save_png(folder / "masks" / f"s{i:02d}.png", mask)
    junk_beside(folder / "images", "s00.jpg")


def write_text_files(folder: Path) -> None:
    """A UTF-8 CSV with a byte-order mark (Excel's "CSV UTF-8"), a TSV, and a UTF-16 TSV (Excel's "Unicode text")."""
    folder.mkdir(parents=True)
    thirds = [TEXT_ROWS[0:3], TEXT_ROWS[3:6], TEXT_ROWS[6:9]]

    def table(rows, delimiter: str) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, delimiter=delimiter, lineterminator="\n")
        writer.writerow(["text", "label"])
        writer.writerows([text, label] for label, text in rows)
        return buffer.getvalue()

    (folder / "reviews.csv").write_bytes(table(thirds[0], ",").encode("utf-8-sig"))
    (folder / "more.tsv").write_text(table(thirds[1], "\t"), encoding="utf-8")
    (folder / "excel.tsv").write_bytes(table(thirds[2], "\t").encode("utf-16"))
    junk_beside(folder, "reviews.csv")


def raw_case(tmp_path_factory: pytest.TempPathFactory) -> RawCase:
    """The raw files, and the predict command (in-process, as `python -m trainlab.predict models/<task> <folder>`)
    run once per task on them."""
    if "case" in _BUILT:
        return _BUILT["case"]
    from trainlab.predict import main

    root = trained_workspace(tmp_path_factory)
    base = tmp_path_factory.mktemp("raw_inputs")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["base"].update(device="cpu", channels_last=False)
    params["tracking"]["enabled"] = False
    (base / "params.yaml").write_text(yaml.safe_dump(params))
    case = RawCase(root, base / "params.yaml", {task: base / "raw" / task for task in TASK_FOLDERS})
    write_classifier_files(root, case.raw["classifier"])
    write_segmenter_files(case.raw["segmenter"])
    write_text_files(case.raw["text"])
    for task in TASK_FOLDERS:
        case.predicted[task] = base / "predicted" / task
        main([str(root / "models" / task), case.given(task), "--out", str(case.predicted[task]),
              "--params", str(case.params)])
    _BUILT["case"] = case
    return case


def raw_values(case: RawCase, task: str) -> list[Any]:
    """What a client sends the served model for the same raw files, in the predict command's order: each image
    file's bytes, or the texts as the command's reader read them from the tables."""
    if task != "text":
        return [Path(row["input"]).read_bytes() for row in case.rows(task)]
    from trainlab.core.config import load_params
    from trainlab.jobs.predict import text_inputs

    return text_inputs([case.given("text")], load_params(case.params), None).items


def assert_same_as_command(case: RawCase, task: str, records: list[dict[str, Any]], who: str) -> None:
    """`records` (the MLflow model's output rows; mask_png as PNG bytes) say what the predict command wrote: the same
    label and probability (to the 6 decimals the command writes) for every input, or the same mask pixel for pixel."""
    if task == "segmenter":
        masks = [np.asarray(Image.open(io.BytesIO(r["mask_png"]))) for r in records]
        expected = case.masks()
        assert len(masks) == len(expected)
        for i, (mask, want) in enumerate(zip(masks, expected)):
            assert np.array_equal(mask, want), f"{who}: mask {i} differs from the predict command's"
        return
    rows = case.rows(task)
    assert [r["label"] for r in records] == [r["label"] for r in rows], f"{who}: labels differ"
    chosen = [f"{float(r['prob_' + r['label']]):.6f}" for r in records]
    assert chosen == [r["probability"] for r in rows], f"{who}: probabilities differ"
