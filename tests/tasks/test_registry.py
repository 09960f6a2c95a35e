"""trainlab.tasks: the registry is what training, evaluation, profiling and compare read; a fourth task registered in
a few lines trains and evaluates like the three built-in ones."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainlab import tasks
from trainlab.core.config import ClassifierParams, Params
from trainlab.data.prepared import save_meta, save_split
from trainlab.engine.contract import Trainable
from trainlab.tasks.base import TaskCode
from trainlab.tasks.metrics import METRICS, metric_collection

# --- a toy fourth task: is x above y? two small-integer coordinates in, two classes out -------------------------

def build_toy(cfg: ClassifierParams, num_classes: int) -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, num_classes))
    model.config = {"task": "toy", "arch": "mlp", "num_classes": num_classes}
    return model


class ToyCode(TaskCode):
    spec_name, params_type, builder = "toy", ClassifierParams, staticmethod(build_toy)

    def sizes(self, meta):
        return {"num_classes": meta["num_classes"]}

    def config_fields(self, fields):
        return {}  # its config names no params field

    def check_inputs(self, x, y, meta, path, meta_file):
        assert x.ndim == 2 and x.shape[1] == 2

    def tta(self, meta):
        return "none"

    def make_trainable(self, model, meta, cfg=None):
        return Trainable("toy", model, lambda logits, y: F.cross_entropy(logits.float(), y),
                    lambda: metric_collection(meta["num_classes"], "accuracy", "macro_f1"),
                    lambda batch, train, gen: (batch["points"].float() / 10, batch["labels"]), "accuracy")


CODE = ToyCode()
TOY = tasks.TaskSpec("toy", "toy", "points", "labels", ("num_classes",), METRICS["classifier"], __name__,
                     section="classifier")


@pytest.fixture
def toy_trainable():
    tasks.register(TOY)
    yield TOY
    tasks.unregister(TOY.name)


def write_toy_data(folder, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for split, n in (("train", 512), ("val", 128), ("test", 128)):
        points = torch.randint(-10, 11, (n, 2), generator=gen, dtype=torch.int8)
        save_split(folder, split, {"points": points, "labels": (points[:, 0] > points[:, 1]).long()})
    save_meta(folder, {"task": "toy", "num_classes": 2, "class_names": ["below", "above"]})


# ----------------------------------------------------------------------------------------------------------------

def test_the_built_in_tasks_are_registered_with_their_stages_and_data():
    assert tasks.names() == ("classifier", "segmenter", "text")
    assert [tasks.get(n).stage for n in tasks.names()] == ["train_classifier", "train_segmenter", "train_text"]
    assert tasks.get("segmenter").data_folder == "segmentation" and tasks.get("segmenter").primary_metric == "mean_iou"
    with pytest.raises(ValueError, match="unknown task 'detector'"):
        tasks.get("detector")


def test_the_registry_loads_no_torch(tmp_path):
    import subprocess
    import sys

    code = "import sys, trainlab.tasks as t; t.names(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_registered_fourth_task_trains_and_evaluates(toy_trainable, tmp_path, monkeypatch, repo_params):
    from trainlab.core.runtime import resolve_runtime
    from trainlab.jobs.evaluate import output_files, run_evaluation
    from trainlab.jobs.train import train_task

    monkeypatch.chdir(tmp_path)
    data_root, models_root = tmp_path / "data", tmp_path / "models"
    write_toy_data(data_root / "toy")
    params = Params.model_validate({
        **repo_params.model_dump(), "tracking": {**repo_params.tracking.model_dump(), "enabled": False},
        "base": {**repo_params.base.model_dump(), "precision": "fp32", "num_workers": 0},
        "classifier": {**repo_params.classifier.model_dump(), "epochs": 4, "batch_size": 32, "lr": 0.01,
                       "warmup_epochs": 0, "pretrained": None}})
    runtime = resolve_runtime(params.base)

    outcome = train_task("toy", params, data_root / "toy", models_root / "toy", tmp_path / "reports" / "toy", runtime)
    assert outcome.test["accuracy"] > 0.9  # a line through the origin: learnable in a few epochs
    assert json.loads((tmp_path / "reports/toy/metrics.json").read_text()) == {
        "test_accuracy": pytest.approx(outcome.test["accuracy"])}

    metrics = run_evaluation(params, data_root, models_root, tmp_path / "evaluate", runtime, tasks=("toy",))
    assert metrics["toy"]["accuracy"] == pytest.approx(outcome.test["accuracy"], abs=1e-6)
    assert set(metrics["toy"]["recall"]) == {"below", "above"}
    written = {p.name for p in (tmp_path / "evaluate").iterdir()}
    assert written == {"metrics.json", "toy_confusion.csv", "toy_per_class.csv", "confusion_matrices.json",
                       "training_curves.png"}  # a fourth task's curves come with it, from its info.json
    assert written == set(output_files(("toy",)))


def test_compare_and_the_summary_read_the_primary_metric_from_the_registry(toy_trainable):
    from pipelines.compare import primary_metric, stage_name

    assert primary_metric("segmenter") == "test_mean_iou" and primary_metric("toy") == "test_accuracy"
    assert stage_name("toy") == "train_toy"
