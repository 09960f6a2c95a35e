"""Tests for the evaluate stage: tiny prepared data and models in tmp, the files, MLflow run and numbers' sanity."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from stages.evaluate import main
from trainlab.core.config import ClassifierParams, SegmenterParams, TextParams, load_params
from trainlab.core.errors import CheckpointError, DataError
from trainlab.core.runtime import resolve_runtime
from trainlab.data.prepared import save_jsonl, save_meta, save_split
from trainlab.data.tokenizer import Tokenizer
from trainlab.jobs.evaluate import load_inputs, output_files
from trainlab.jobs.train import save_model
from trainlab.models.classifier import build_classifier
from trainlab.models.segmenter import build_segmenter
from trainlab.models.text import build_text_model
from trainlab.tasks.scoring import run_test_split
from trainlab.tracking.lineage import file_md5

REPO = Path(__file__).resolve().parents[2]
DIGITS = [str(d) for d in range(10)]
CANVAS_CLASSES = ["background", *DIGITS]
WORDS = {"negative": "awful terrible sad bad", "neutral": "fine okay plain whatever", "positive": "great lovely happy"}
RUN_IDS = {"classifier": "run-classifier-0001", "segmenter": "run-segmenter-0002", "text": "run-text-0003"}
TEST_SIZES = {"classifier": 24, "segmenter": 6, "text": 12}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and 2 threads on a busy 2-core machine can be 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bar_digits(n: int) -> dict[str, torch.Tensor]:
    """28x28 images with a bright vertical bar whose column depends on the label."""
    labels = torch.arange(n) % 10
    images = torch.zeros(n, 1, 28, 28, dtype=torch.uint8)
    for i, label in enumerate(labels.tolist()):
        images[i, 0, 4:24, 3 + 2 * label:5 + 2 * label] = 230
    return {"images": images, "labels": labels}


def canvases(n: int, size: int = 32) -> dict[str, torch.Tensor]:
    """Canvases with two labelled squares each; the image is bright where the mask is not background."""
    masks = torch.zeros(n, size, size, dtype=torch.uint8)
    for i in range(n):
        masks[i, 2:12, 2 + i:12 + i] = 1 + i % 10
        masks[i, 18:28, 16:26] = 1 + (i + 5) % 10
    return {"images": (masks > 0).to(torch.uint8).mul(200).unsqueeze(1), "masks": masks}


def texts(n: int) -> tuple[list[str], torch.Tensor]:
    names = list(WORDS)
    labels = torch.arange(n) % len(names)
    return [f"{WORDS[names[label]]} number {i}" for i, label in enumerate(labels.tolist())], labels


def write_data(root: Path) -> None:
    cls, seg, txt = root / "classification", root / "segmentation", root / "text"
    sizes = {"train": 4, "val": 4}
    for split in ("train", "val", "test"):
        save_split(cls, split, bar_digits(sizes.get(split, TEST_SIZES["classifier"])))
        save_split(seg, split, canvases(sizes.get(split, TEST_SIZES["segmenter"])))
    save_meta(cls, {"task": "classification", "num_classes": 10, "class_names": DIGITS, "channels": 1,
                    "height": 28, "width": 28})
    save_meta(seg, {"task": "segmentation", "num_classes": 11, "class_names": CANVAS_CLASSES, "channels": 1,
                    "height": 32, "width": 32})
    split_texts = {split: texts(sizes.get(split, TEST_SIZES["text"])) for split in ("train", "val", "test")}
    tokenizer = Tokenizer.fit(split_texts["train"][0] + split_texts["test"][0], 64, 1, 12)
    tokenizer.save(txt / "tokenizer.json")
    for split, (strings, labels) in split_texts.items():
        save_split(txt, split, {"tokens": tokenizer.encode(strings), "labels": labels})
        save_jsonl(txt / f"{split}.jsonl", [{"text": s, "label": int(y)} for s, y in zip(strings, labels)])
    save_meta(txt, {"task": "text", "num_classes": 3, "class_names": list(WORDS), "vocab_size": tokenizer.vocab_size,
                    "max_length": 12, "pad_id": 0, "unk_id": 1, "cls_id": 2})


def write_models(models: Path, data: Path, classifier_classes: int = 10) -> None:
    torch.manual_seed(0)
    info = {name: {"info.json": {"task": name, "run_id": run_id}} for name, run_id in RUN_IDS.items()}
    save_model(build_classifier(ClassifierParams(width=8), classifier_classes, 1), models / "classifier",
               extra_json=info["classifier"])
    save_model(build_segmenter(SegmenterParams(base_channels=4, depth=2), 11, 1), models / "segmenter",
               extra_json=info["segmenter"])
    meta = json.loads((data / "text" / "meta.json").read_text())
    text_model = build_text_model(TextParams(arch="transformer", d_model=16, n_heads=2, n_layers=1, dim_feedforward=32),
                                  vocab_size=meta["vocab_size"], num_classes=3, max_length=12)
    baseline = {"accuracy": 0.75, "macro_f1": 0.7, "confusion_matrix": [[3, 1, 0], [0, 3, 1], [1, 0, 3]]}
    save_model(text_model, models / "text", {"tokenizer.json": data / "text" / "tokenizer.json"},
               {**info["text"], "baseline.json": baseline})


def write_params(path: Path, tracking: bool = True, **evaluate) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["base"].update({"device": "cpu", "precision": "fp32"})
    params["evaluate"] = {"batch_size": 8, "tta": False, "n_examples": 3, **evaluate}
    params["tracking"].update({"enabled": tracking, "uri": None, "register_models": False})
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """tmp/{data/prepared, models, params.yaml, params_off.yaml} with tiny untrained models (written once)."""
    root = tmp_path_factory.mktemp("evaluate")
    write_data(root / "data" / "prepared")
    write_models(root / "models", root / "data" / "prepared")
    write_params(root / "params.yaml")
    write_params(root / "params_off.yaml", tracking=False)
    return root


@pytest.fixture(scope="module")
def evaluated(workspace):
    """Run the stage once, in-process, with MLflow in a tmp SQLite store."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workspace)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workspace}/mlflow.db")
        mp.delenv("TRAINLAB_PARENT_RUN_ID", raising=False)
        metrics = main(["data/prepared", "models", "reports/evaluate", "--params", "params.yaml"])
    return workspace, metrics


@pytest.fixture
def copy_of(workspace, tmp_path, monkeypatch):
    """A private copy of the workspace (data, models, params) as the cwd."""
    for name in ("data", "models"):
        shutil.copytree(workspace / name, tmp_path / name)
    shutil.copy(workspace / "params_off.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_writes_exactly_the_declared_files(evaluated):
    root, _ = evaluated
    out = root / "reports" / "evaluate"
    assert sorted(p.name for p in out.iterdir()) == sorted(output_files())
    assert [p.name for p in (root / "reports").iterdir()] == ["evaluate"]  # no temp folders left behind
    for name in output_files():
        if name.endswith(".png"):
            data = (out / name).read_bytes()
            # with a Transformer text model the n-gram picture is a one-line notice saying why it is empty
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > (3000 if name == "text_ngrams.png" else 5000), name


def test_metrics_json_keys_and_ranges(evaluated):
    root, returned = evaluated
    headline = json.loads((root / "reports" / "evaluate" / "metrics.json").read_text())
    metrics = returned
    assert set(headline) == {"classifier", "segmenter", "text"}  # DVC metrics: no per-class figures
    assert headline["classifier"] == {k: metrics["classifier"][k] for k in ("accuracy", "macro_f1", "test_samples")}
    assert set(headline["segmenter"]) == {"mean_iou", "mean_dice", "pixel_accuracy", "test_samples"}
    assert set(headline["text"]) == {"accuracy", "macro_f1", "test_samples", "baseline_accuracy",
                                     "baseline_macro_f1"}
    assert set(metrics) == {"classifier", "segmenter", "text"}
    assert set(metrics["classifier"]) == {"accuracy", "macro_f1", "precision", "recall", "test_samples"}
    assert set(metrics["segmenter"]) == {"mean_iou", "mean_dice", "pixel_accuracy", "iou", "dice", "test_samples"}
    assert set(metrics["text"]) == {"accuracy", "macro_f1", "precision", "recall", "test_samples",
                                    "baseline_accuracy", "baseline_macro_f1"}
    assert list(metrics["classifier"]["precision"]) == DIGITS
    assert list(metrics["segmenter"]["iou"]) == CANVAS_CLASSES
    assert list(metrics["text"]["recall"]) == list(WORDS)
    assert {k: metrics[k]["test_samples"] for k in TEST_SIZES} == TEST_SIZES
    assert (metrics["text"]["baseline_accuracy"], metrics["text"]["baseline_macro_f1"]) == (0.75, 0.7)
    flat = [v for task in metrics.values() for x in task.values() for v in (x.values() if isinstance(x, dict) else [x])]
    assert all(0 <= v <= 1 for v in flat if isinstance(v, float))


def test_confusion_data_agrees_with_the_metrics(evaluated):
    root, metrics = evaluated
    out = root / "reports" / "evaluate"
    matrices = json.loads((out / "confusion_matrices.json").read_text())
    for task, csv_name in (("classifier", "classifier_confusion.csv"), ("text", "text_confusion.csv")):
        rows = read_rows(out / csv_name)
        matrix = torch.tensor(matrices[task]["matrix"])
        assert len(rows) == TEST_SIZES[task] == int(matrix.sum())
        assert set(rows[0]) == {"actual", "predicted"}
        labels = matrices[task]["labels"]
        from_rows = torch.zeros_like(matrix)
        for row in rows:
            from_rows[labels.index(row["actual"]), labels.index(row["predicted"])] += 1
        assert torch.equal(from_rows, matrix)
        correct = sum(r["actual"] == r["predicted"] for r in rows)
        assert metrics[task]["accuracy"] == pytest.approx(correct / len(rows), abs=1e-6)
        recall = matrix.diag() / matrix.sum(1).clamp(min=1)
        assert list(metrics[task]["recall"].values()) == pytest.approx(recall.tolist(), abs=1e-6)
    assert matrices["text"]["baseline_matrix"] == [[3, 1, 0], [0, 3, 1], [1, 0, 3]]


def test_per_class_figures_are_plot_data(evaluated):
    root, metrics = evaluated
    out = root / "reports" / "evaluate"
    for task, columns in (("classifier", ("precision", "recall")), ("segmenter", ("iou", "dice")),
                          ("text", ("precision", "recall"))):
        rows = read_rows(out / f"{task}_per_class.csv")
        assert [r["class"] for r in rows] == list(metrics[task][columns[0]])
        for column in columns:
            assert [float(r[column]) for r in rows] == list(metrics[task][column].values())


def test_segmenter_dice_and_iou_agree(evaluated):
    _, metrics = evaluated
    seg = metrics["segmenter"]
    for name in CANVAS_CLASSES:
        iou, dice = seg["iou"][name], seg["dice"][name]
        assert dice == pytest.approx(2 * iou / (1 + iou), abs=1e-5)


def test_one_mlflow_run_linked_to_the_training_runs(evaluated):
    import mlflow

    root, metrics = evaluated
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name("trainlab")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["stage"] == "evaluate"
    # no training run in this store carries the models' md5: the run ids come from the older info.json files
    assert {k: run.data.tags[f"{k}_run_id"] for k in RUN_IDS} == RUN_IDS
    assert run.data.tags["classifier_model_md5"] == file_md5(root / "models/classifier/model.safetensors")
    assert run.info.run_name.startswith("evaluate ")
    inputs = {(d.dataset.name, d.dataset.digest, d.tags[0].value) for d in run.inputs.dataset_inputs}
    assert inputs == {(f"{f}/test", file_md5(root / "data/prepared" / f / "test.safetensors"), "test")
                      for f in ("classification", "segmentation", "text")}
    assert run.data.params["evaluate.tta"] == "False"
    assert run.data.metrics["classifier.accuracy"] == pytest.approx(metrics["classifier"]["accuracy"])
    assert run.data.metrics["segmenter.iou.background"] == pytest.approx(metrics["segmenter"]["iou"]["background"])
    assert run.data.metrics["text.baseline_accuracy"] == 0.75
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert set(output_files()) <= logged


def test_lineage_finds_the_training_run_by_the_model_md5(copy_of, tmp_path, monkeypatch):
    """A model restored from DVC's cache has no run id beside it: its md5 finds the run that trained it."""
    import mlflow

    from trainlab.tracking.runs import start_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    write_params(copy_of / "params.yaml")
    params = load_params(copy_of / "params.yaml")
    md5 = file_md5(copy_of / "models/classifier/model.safetensors")
    for tag in ("0" * 32, md5):  # another model's run, then this model's
        with start_run(params, stage="train_classifier", tags={"model_md5": tag}) as trained:
            pass
    main(["data/prepared", "models", "reports/evaluate"])
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run, = client.search_runs([trained.experiment_id], "tags.stage = 'evaluate'")
    assert run.data.tags["classifier_run_id"] == trained.run_id
    assert run.data.tags["segmenter_run_id"] == RUN_IDS["segmenter"]


def test_tta_predictions_are_deterministic(workspace):
    runtime = resolve_runtime(load_params(workspace / "params_off.yaml").base)
    for name in ("classifier", "segmenter"):
        inputs = load_inputs(name, workspace / "data" / "prepared", workspace / "models", runtime.device)
        plain, *tta = (run_test_split(inputs, runtime, 4, tta=flag) for flag in (False, True, True))
        assert all(torch.equal(tta[0].metrics[k], tta[1].metrics[k]) for k in plain.metrics)
        assert torch.equal(tta[0].predicted, tta[1].predicted)
        assert plain.predicted.shape == tta[0].predicted.shape


def test_missing_model_folder_is_a_clear_error_with_no_outputs(copy_of, capsys):
    from trainlab.core.cli import run_cli

    shutil.rmtree(copy_of / "models" / "segmenter")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["data/prepared", "models", "reports/evaluate"])
    assert exit_info.value.code == CheckpointError.exit_code
    assert "models/segmenter" in capsys.readouterr().err
    assert not (copy_of / "reports").exists()


def test_model_with_other_class_count_names_the_files_and_keeps_old_outputs(copy_of):
    old = copy_of / "reports" / "evaluate"
    old.mkdir(parents=True)
    (old / "metrics.json").write_text("{}")
    write_models(copy_of / "models", copy_of / "data" / "prepared", classifier_classes=5)
    with pytest.raises(CheckpointError, match=r"models/classifier/config\.json.*num_classes=5.*meta\.json"):
        main(["data/prepared", "models", "reports/evaluate"])
    assert [p.name for p in old.iterdir()] == ["metrics.json"]
    assert [p.name for p in old.parent.iterdir()] == ["evaluate"]


def test_labels_outside_the_model_classes_are_a_data_error(copy_of):
    data = copy_of / "data" / "prepared" / "text"
    tokens = torch.full((2, 12), 2)
    save_split(data, "test", {"tokens": tokens, "labels": torch.tensor([0, 7])})
    with pytest.raises(DataError, match=r"text/test\.safetensors: labels 0\.\.7 outside the 3 classes"):
        main(["data/prepared", "models", "reports/evaluate"])


def test_missing_baseline_is_a_checkpoint_error(copy_of, capsys):
    from trainlab.core.cli import run_cli

    (copy_of / "models" / "text" / "baseline.json").unlink()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["data/prepared", "models", "reports/evaluate"])
    assert exit_info.value.code == CheckpointError.exit_code
    assert "models/text/baseline.json: missing" in capsys.readouterr().err
    assert not (copy_of / "reports").exists()


def test_text_model_with_another_vocabulary_is_refused(copy_of):
    from trainlab.data.tokenizer import SPECIAL_TOKENS

    Tokenizer([*SPECIAL_TOKENS, "other", "words"], 12).save(copy_of / "models" / "text" / "tokenizer.json")
    with pytest.raises(CheckpointError, match=r"models/text/tokenizer\.json: the model's vocabulary differs"):
        main(["data/prepared", "models", "reports/evaluate"])


def test_every_task_evaluates_alike_streamed_from_disk_and_in_memory(workspace):
    """A test split over base.data_on_device_max_mb is read from its files a batch at a time: same report."""
    params = load_params(workspace / "params_off.yaml")
    runtime = resolve_runtime(params.base)
    for name in ("classifier", "segmenter", "text"):
        reports = [load_inputs(name, workspace / "data" / "prepared", workspace / "models", runtime.device, limit)
                   for limit in (None, 0)]
        streamed = {k for k, v in reports[1].test.items() if not torch.is_tensor(v)}
        # labels always in memory; images and masks read on demand; token ids never streamed (small)
        assert streamed == {"classifier": {"images"}, "segmenter": {"images", "masks"}, "text": set()}[name]
        first, second = (inputs.code.evaluate(inputs, runtime, params) for inputs in reports)
        assert first.metrics == second.metrics and first.confusion == second.confusion
