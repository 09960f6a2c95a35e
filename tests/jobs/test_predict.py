"""The predict command on raw files with tiny trained models: exactly evaluate's numbers on the test split written
back out as raw files, registry models, bad inputs named with exit 8, preprocessing that does not fit refused."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from tests.serving.workspace import TASK_FOLDERS, tracking_uri, trained_workspace
from trainlab.core.cli import run_cli
from trainlab.predict import main

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return trained_workspace(tmp_path_factory)


@pytest.fixture
def in_root(root, monkeypatch):
    """cwd = the workspace (its params.yaml), MLflow at its store, one torch thread."""
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(root))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield root
    torch.set_num_threads(threads)


def predict(argv: list[str], capsys) -> tuple[int, str]:
    """Run the command in-process: (exit code, stderr)."""
    try:
        run_cli(main, argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def split_of(root: Path, task: str) -> dict[str, torch.Tensor]:
    return load_file(str(root / "data" / "prepared" / TASK_FOLDERS[task] / "test.safetensors"))


def write_raw(root: Path, task: str, dst: Path) -> Path:
    """The test split as raw files: PNGs of the stored uint8 images (in test order), or the texts as prepare read
    them in a CSV with the `text` column."""
    dst.mkdir(parents=True)
    if task == "text":
        rows = [json.loads(line) for line in (root / "data/prepared/text/test.jsonl").read_text().splitlines()]
        with open(dst / "texts.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "text"])
            writer.writerows([i, row["text"]] for i, row in enumerate(rows))
        return dst / "texts.csv"
    for i, image in enumerate(split_of(root, task)["images"]):
        Image.fromarray(image.permute(1, 2, 0).squeeze(2).numpy()).save(dst / f"{i:06d}.png")
    return dst


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def evaluate_metrics(root: Path) -> dict:
    return json.loads((root / "reports" / "evaluate" / "metrics.json").read_text())


@pytest.mark.parametrize("task", ["classifier", "text"])
def test_raw_test_split_gives_exactly_the_accuracy_evaluate_reports(in_root, tmp_path, capsys, task):
    raw = write_raw(in_root, task, tmp_path / "raw")
    code, err = predict([f"models/{task}", str(raw), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    rows = read_csv(tmp_path / "out" / "predictions.csv")
    labels = split_of(in_root, task)["labels"].tolist()
    names = json.loads((in_root / "models" / task / "preprocessing.json").read_text())["class_names"]
    assert len(rows) == len(labels)
    accuracy = sum(names[y] == row["label"] for y, row in zip(labels, rows)) / len(labels)
    assert round(accuracy, 6) == evaluate_metrics(in_root)[task]["accuracy"]
    # and sample by sample: evaluate's confusion rows hold its prediction for every test sample
    evaluated = read_csv(in_root / "reports" / "evaluate" / f"{task}_confusion.csv")
    assert [row["label"] for row in rows] == [row["predicted"] for row in evaluated]
    assert len({row["label"] for row in rows}) > 1  # a model that tells classes apart, not a constant
    first = rows[0]
    assert float(first["probability"]) == pytest.approx(float(first["top_k"].split("; ")[0].rsplit(":", 1)[1]),
                                                        abs=1e-4)
    assert first["top_k"].split("; ")[0].rsplit(":", 1)[0] == first["label"]


def test_raw_test_split_gives_exactly_the_mean_iou_evaluate_reports(in_root, tmp_path, capsys):
    from trainlab.tasks.metrics import segmentation_metrics

    raw = write_raw(in_root, "segmenter", tmp_path / "raw")
    code, err = predict(["models/segmenter", str(raw), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    rows = read_csv(out / "fractions.csv")
    masks = split_of(in_root, "segmenter")["masks"]
    assert [Path(r["input"]).name for r in rows] == [f"{i:06d}.png" for i in range(len(masks))]
    predicted = torch.stack([torch.from_numpy(np.array(Image.open(out / r["mask"]))) for r in rows]).long()
    assert predicted.shape == masks.shape  # at each image's own size
    metrics = segmentation_metrics(11)
    metrics.update(predicted, masks.long())
    assert round(float(metrics.compute()["mean_iou"]), 6) == evaluate_metrics(in_root)["segmenter"]["mean_iou"]
    first = predicted[0].numpy()
    fractions = [float(rows[0][str(n)]) for n in ["background", *map(str, range(10))]]
    assert fractions == pytest.approx(np.bincount(first.ravel(), minlength=11) / first.size, abs=1e-6)
    assert Image.open(out / "overlays" / "000000.png").size == (32, 32)


def test_segmenter_masks_come_back_at_the_images_own_size(in_root, tmp_path, capsys):
    Image.fromarray(np.full((40, 50), 200, np.uint8)).save(tmp_path / "wide.png")
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "photo.jpg")
    code, err = predict(["models/segmenter", str(tmp_path / "*.png"), str(tmp_path / "photo.jpg"), "--out",
                         str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert Image.open(tmp_path / "out" / "masks" / "wide.png").size == (50, 40)
    assert Image.open(tmp_path / "out" / "overlays" / "wide.png").mode == "RGB"
    assert Image.open(tmp_path / "out" / "masks" / "photo.png").size == (64, 64)


def test_the_registry_champion_predicts_what_the_model_folder_does(in_root, tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    for i, image in enumerate(split_of(in_root, "classifier")["images"][:20]):
        Image.fromarray(image[0].numpy()).save(raw / f"{i:02d}.png")
    import mlflow

    run_id = mlflow.MlflowClient(tracking_uri(in_root)).get_model_version("trainlab-classifier", "1").run_id
    for model, out in (("models/classifier", "disk"), ("models:/trainlab-classifier@champion", "champion"),
                       ("models:/trainlab-classifier/1", "v1"), (f"runs:/{run_id}/classifier", "run")):
        code, err = predict([model, str(raw), "--out", str(tmp_path / out)], capsys)
        assert code == 0, err
    disk = (tmp_path / "disk" / "predictions.csv").read_text()
    for out in ("champion", "v1", "run"):
        assert (tmp_path / out / "predictions.csv").read_text() == disk


def test_texts_from_stdin_and_tsv(in_root, tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("I love this!\nwhat a sad day\n"))
    code, err = predict(["models:/trainlab-text@champion", "--out", str(tmp_path / "stdin")], capsys)
    assert code == 0, err
    rows = read_csv(tmp_path / "stdin" / "predictions.csv")
    assert [r["input"] for r in rows] == ["stdin: line 1", "stdin: line 2"]
    assert [r["text"] for r in rows] == ["I love this!", "what a sad day"]
    assert all(r["label"] in ("negative", "neutral", "positive") for r in rows)
    (tmp_path / "t.tsv").write_text("text\tother\nI love this!\tx\n")
    code, err = predict(["models/text", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "tsv")], capsys)
    assert code == 0, err
    assert read_csv(tmp_path / "tsv" / "predictions.csv")[0]["label"] == rows[0]["label"]


def test_bad_images_are_named_the_good_ones_predicted_exit_8(in_root, tmp_path, capsys):
    good = tmp_path / "good.png"
    Image.fromarray(split_of(in_root, "classifier")["images"][0, 0].numpy()).save(good)
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "empty.jpg").write_bytes(b"")
    out = tmp_path / "out"
    code, err = predict(["models/classifier", str(good), str(tmp_path / "corrupt.png"), str(tmp_path / "empty.jpg"),
                         str(tmp_path / "missing.png"), "--out", str(out)], capsys)
    assert code == 8, err
    assert "3 of 4 inputs could not be predicted" in err
    for name in ("corrupt.png: unreadable or corrupt image", "empty.jpg: unreadable or corrupt image",
                 "missing.png: file not found"):
        assert name in err
    assert [r["input"] for r in read_csv(out / "predictions.csv")] == [str(good)]
    assert len(read_csv(out / "rejected.csv")) == 3
    assert not list(tmp_path.glob(".out.*"))  # no staging folder left


def test_bad_texts_are_named_by_row_exit_8(in_root, tmp_path, capsys):
    (tmp_path / "a.csv").write_text("text,label\nI love this!,1\n   ,2\n\"\",3\nfine,4\n")
    (tmp_path / "b.csv").write_text("review\nnice\n")
    out = tmp_path / "out"
    code, err = predict(["models/text", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--out", str(out)], capsys)
    assert code == 8, err
    assert f"{tmp_path / 'a.csv'}: row 3: empty text" in err
    assert f"{tmp_path / 'a.csv'}: row 4: empty text" in err
    assert f"{tmp_path / 'b.csv'}: column 'text' not found (data.text.text_column); the columns are: review" in err
    assert [r["input"] for r in read_csv(out / "predictions.csv")] == [f"{tmp_path / 'a.csv'}: row {n}" for n in (2, 5)]


def test_no_good_input_exit_3_nothing_written(in_root, tmp_path, capsys):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    out = tmp_path / "out"
    code, err = predict(["models/classifier", str(tmp_path / "bad.png"), "--out", str(out)], capsys)
    assert code == 3 and "none of the 1 inputs could be predicted; nothing written" in err and "bad.png" in err
    assert not out.exists()


@pytest.mark.parametrize("task,change,says", [
    ("classifier", {"image": {"channels": 3}}, "3-channel images but the model takes in_channels=1"),
    ("segmenter", {"task": "classifier"}, "task 'classifier' but"),
    ("classifier", {"class_names": ["cat", "dog"]}, "2 class names but the model has num_classes=10"),
    ("segmenter", {"image": {"mean": 0.1307}}, "normalisation mean 0.1307"),
    ("text", {"text": {"max_length": 64}}, "max_length 64 but the tokenizer says 32"),  # a record from before the
    ("text", {"text": {"lowercase": False}}, "lowercase False but the tokenizer says True"),  # tokenizer held them
    ("text", {"text": {"cleaning": "none"}}, "text cleaning 'none' is not this code's 'whitespace'"),
], ids=["channels", "task", "classes", "normalisation", "max-length", "lowercase", "cleaning"])
def test_preprocessing_that_does_not_fit_the_model_fails_loudly_exit_4(in_root, tmp_path, capsys, task, change, says):
    folder = tmp_path / task
    shutil.copytree(in_root / "models" / task, folder)
    record = json.loads((folder / "preprocessing.json").read_text())
    for key, value in change.items():
        record[key] = {**record[key], **value} if isinstance(value, dict) else value
    (folder / "preprocessing.json").write_text(json.dumps(record))
    (tmp_path / "in.csv").write_text("text\nhello\n")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "in.png")
    inputs = str(tmp_path / ("in.csv" if task == "text" else "in.png"))
    code, err = predict([str(folder), inputs, "--out", str(tmp_path / "out")], capsys)
    assert code == 4, err
    assert f"{folder / 'preprocessing.json'}: " in err and says in err
    assert not (tmp_path / "out").exists()


def test_a_model_folder_without_its_preprocessing_record_is_refused(in_root, tmp_path, capsys):
    folder = tmp_path / "classifier"
    shutil.copytree(in_root / "models" / "classifier", folder)
    (folder / "preprocessing.json").unlink()
    code, err = predict([str(folder), "x.png", "--out", str(tmp_path / "out")], capsys)
    assert code == 4 and f"{folder / 'preprocessing.json'}: missing" in err


def test_a_tensor_level_registered_version_gets_a_clear_message(in_root, tmp_path, capsys):
    """A version registered the way training did before raw-input models (the torch model on tensors)."""
    from trainlab.core.config import load_params
    from trainlab.tasks.saved import load_saved_model
    from trainlab.tracking.runs import start_run

    params = load_params(in_root / "params.yaml")
    model = load_saved_model(in_root / "models" / "classifier", "classifier").model
    with start_run(params, stage="legacy") as tracker:
        tracker.log_model(model, "classifier", torch.zeros(2, 1, 28, 28), registered_model_name="trainlab-legacy")
    code, err = predict(["models:/trainlab-legacy/1", "x.png", "--out", str(tmp_path / "out")], capsys)
    assert code == 4, err
    assert "models:/trainlab-legacy/1: a tensor-level torch model" in err and "Train again" in err


def test_an_unknown_registered_model_is_named(in_root, tmp_path, capsys):
    code, err = predict(["models:/trainlab-nothing@champion", "x.png", "--out", str(tmp_path / "out")], capsys)
    assert code == 4 and "models:/trainlab-nothing@champion: could not be loaded from the MLflow store" in err
