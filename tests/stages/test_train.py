"""The three training stages on real prepared data with tiny models: the loss falls, outputs and MLflow runs exist."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
import yaml

from stages import prepare, text_baseline, train_classifier, train_segmenter, train_text
from trainlab.tasks.saved import load_saved_model
from trainlab.tracking.lineage import file_md5

REPO = Path(__file__).resolve().parents[2]
# A bare environment, but the thread count of this test process (tests/conftest.py sets one per xdist worker) and
# the instruction set it is held to, if any (docs/reproducibility.md): the numbers compared bit for bit depend on them.
BARE_ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
            **{k: v for k, v in os.environ.items()
               if k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}}
TRAIN = {"epochs": 2, "lr": 0.01, "warmup_epochs": 0.0, "min_steps": None}  # exactly 2 epochs
TINY = {
    "base": {"seed": 3, "precision": "fp32"},  # the text bag test compares the fp32 rebuild with the stage
    "data": {"segmentation": {"canvases_per_digit": 0.06, "canvas_size": 32, "max_digits": 2},
             "text": {"vocab_size": 2000, "max_length": 32}},
    "classifier": {**TRAIN, "width": 8, "batch_size": 128},
    "segmenter": {**TRAIN, "base_channels": 8, "depth": 2, "batch_size": 32},
    # the default TF-IDF bag (its weight decay chosen on validation): seconds on 26,000 tweets (the Transformer
    # runs in tests/pipelines' tiny pipeline)
    "text": {**TRAIN, "arch": "tfidf_bag", "optimizer": "sgd", "lr": 3.0, "buckets": 4096, "char_buckets": 4096,
             "batch_size": 512, "baseline_max_features": 5000, "weight_decay": "auto"},
}
STAGES = {"classifier": (train_classifier, "classification"), "segmenter": (train_segmenter, "segmentation"),
          "text": (train_text, "text")}
STAGE_OPTIONS = {"text": ["--baseline", "models/text_baseline/baseline.json"]}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Real embedded data prepared once, small; a private MLflow store; cwd-relative outputs."""
    root = tmp_path_factory.mktemp("train")
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
    prepare.main(["data/prepared", "reports/data_stats.json"])
    text_baseline.main(["data/prepared/text", "models/text_baseline"])
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def trained(workspace):
    for name, (stage, folder) in STAGES.items():
        stage.main([f"data/prepared/{folder}", f"models/{name}", f"reports/{name}", *STAGE_OPTIONS.get(name, [])])
    return workspace


def history(root: Path, name: str) -> list[dict[str, str]]:
    with open(root / "reports" / name / "history.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", list(STAGES))
def test_loss_falls_and_outputs_exist(trained, name):
    rows = history(trained, name)
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])
    model_dir = trained / "models" / name
    assert {"model.safetensors", "config.json", "info.json"} <= {p.name for p in model_dir.iterdir()}
    metrics = json.loads((trained / "reports" / name / "metrics.json").read_text())
    primary = "test_mean_iou" if name == "segmenter" else "test_accuracy"
    assert {k for k in metrics if not k.startswith("baseline_")} == {primary}  # a DVC metric: the headline only
    info = json.loads((model_dir / "info.json").read_text())
    assert info["epochs"] == 2 and info["params_trainable"] > 0 and info["test"][primary[5:]] == metrics[primary]
    record = json.loads((trained / "reports" / name / "run.json").read_text())  # git-ignored, not a DVC out
    assert record["timing"]["samples_per_s"] > 0 and record["environment"]["python"]
    assert "samples_per_s" not in rows[0]  # history.csv holds what the same inputs reproduce bit for bit
    assert "run_id" not in info and "environment" not in info
    curves = info["history"]  # what the evaluate stage's training curves draw: one row per validation
    assert curves["metric"] == primary[5:]
    assert [(r["step"], r[f"val_{primary[5:]}"]) for r in curves["rows"]] == \
        [(float(r["step"]), float(r[f"val_{primary[5:]}"])) for r in rows]
    saved = load_saved_model(model_dir, name)
    assert saved.info["task"] == name
    assert not (trained / "checkpoints" / name / "last.pt").exists()  # removed after success


def test_classifier_learns_digits(trained):
    metrics = json.loads((trained / "reports/classifier/metrics.json").read_text())
    assert metrics["test_accuracy"] > 0.5  # 10 classes: chance is 0.1


def test_text_stage_reports_the_tfidf_baseline(trained):
    metrics = json.loads((trained / "reports/text/metrics.json").read_text())
    assert 0.4 < metrics["baseline_test_accuracy"] < 1
    assert {"tokenizer.json", "baseline.json"} <= {p.name for p in (trained / "models/text").iterdir()}


def test_text_weight_decay_auto_keeps_the_head_with_the_lowest_validation_loss(trained):
    """text.weight_decay auto: info.json, the MLflow run and history.csv say which candidate the validation split
    chose and how each scored; the saved model is a plain one-head bag (evaluate and serving see nothing else)."""
    from trainlab.models.tfidf_bag import WEIGHT_DECAY_CANDIDATES

    chosen = json.loads((trained / "models/text/info.json").read_text())["chosen"]
    candidates = chosen["candidates"]
    assert set(candidates) == {f"{d:g}" for d in WEIGHT_DECAY_CANDIDATES}
    best = min(candidates, key=lambda d: (candidates[d]["val_loss"], -float(d)))
    assert chosen["weight_decay"] == float(best)
    last = history(trained, "text")[-1]
    assert float(last["val_accuracy"]) == pytest.approx(candidates[best]["val_accuracy"], abs=1e-6)
    assert float(last[f"val_accuracy_wd_{best}"]) == pytest.approx(candidates[best]["val_accuracy"], abs=1e-6)
    record = json.loads((trained / "reports/text/run.json").read_text())
    params = mlflow.MlflowClient(f"sqlite:///{trained}/mlflow.db").get_run(record["mlflow_run_id"]).data.params
    # the params as resolved: the candidates that auto became (also under auto.*), and the one the split chose
    from trainlab.core.auto import WEIGHT_DECAY_CANDIDATES

    for key in ("text.weight_decay", "auto.text.weight_decay"):
        assert [float(v) for v in re.findall(r"[\d.e-]+", params[key])] == list(WEIGHT_DECAY_CANDIDATES), params[key]
    assert float(params["text.chosen.weight_decay"]) == float(best)
    saved = load_saved_model(trained / "models/text", "text")
    assert saved.model.weight_decays == () and saved.model.weight.shape[1] == saved.info["meta"]["num_classes"]


@pytest.mark.parametrize("name", list(STAGES))
def test_mlflow_run_params_metrics_and_registered_model(trained, name):
    client = mlflow.MlflowClient(f"sqlite:///{trained}/mlflow.db")
    record = json.loads((trained / "reports" / name / "run.json").read_text())
    run = client.get_run(record["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["stage"] == f"train_{name}"
    assert run.info.run_name.startswith(f"train_{name} ")  # the stage and the short commit, not a random name
    assert (run.data.tags["model_md5"] == record["model_md5"]
            == file_md5(trained / "models" / name / "model.safetensors"))
    folder = STAGES[name][1]
    inputs = {(d.dataset.name, d.dataset.digest, d.tags[0].value) for d in run.inputs.dataset_inputs}
    assert inputs == {(f"{folder}/{split}", file_md5(trained / "data/prepared" / folder / f"{split}.safetensors"),
                       context) for split, context in (("train", "training"), ("val", "validation"),
                                                       ("test", "test"))}
    assert run.data.params[f"{name}.epochs"] == "2"
    assert "test_accuracy" in run.data.metrics or "test_mean_iou" in run.data.metrics
    with open(trained / "reports" / name / "history.csv", newline="") as f:  # MLflow's steps: the history's
        rows = [(int(float(r["step"])), float(r["epoch"])) for r in csv.DictReader(f)]
    assert [r[1] for r in rows] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [r[0] for r in rows]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch")] == rows
    versions = client.search_model_versions(f"name='trainlab-{name}'")
    assert any(v.run_id == run.info.run_id for v in versions)


def logged_model_artifacts(root: Path, name: str, reports: str) -> set[str]:
    """The artifacts of the pyfunc the stage that wrote `reports`/run.json logged (its model folder, ...)."""
    from mlflow.models import Model

    uri = f"sqlite:///{root}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    run = client.get_run(json.loads((root / reports / "run.json").read_text())["mlflow_run_id"])
    [logged] = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                           filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{name}'")
    local = mlflow.artifacts.download_artifacts(f"models:/{logged.model_id}", tracking_uri=uri)
    return set(Model.load(local).flavors["python_function"]["artifacts"])


def test_the_tensor_level_model_is_logged_only_when_asked(trained):
    assert logged_model_artifacts(trained, "classifier", "reports/classifier") == {"model"}  # the default
    params = {**TINY, "classifier": {**TINY["classifier"], "epochs": 1, "max_steps": 2},
              "tracking": {"log_tensor_model": True}}
    (trained / "params_tensor.yaml").write_text(yaml.safe_dump(params))
    train_classifier.main(["data/prepared/classification", "models/classifier_tensor", "reports/classifier_tensor",
                           "--params", "params_tensor.yaml"])
    assert logged_model_artifacts(trained, "classifier", "reports/classifier_tensor") == {"model", "tensor_model"}


def test_same_params_twice_gives_identical_metrics(trained, tmp_path):
    """Retrain the classifier in a copy of the workspace: metrics.json is identical to the last digit."""
    copy = tmp_path / "again"
    shutil.copytree(trained / "data", copy / "data")
    shutil.copy(trained / "params.yaml", copy / "params.yaml")
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["tracking"] = {"enabled": False}
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, "-m", "stages.train_classifier", "data/prepared/classification",
                           "models/classifier", "reports/classifier"], cwd=copy, capture_output=True, text=True,
                          env=BARE_ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (copy / "reports/classifier/metrics.json").read_bytes() == \
        (trained / "reports/classifier/metrics.json").read_bytes()
    a = load_saved_model(copy / "models/classifier", "classifier").model.state_dict()
    b = load_saved_model(trained / "models/classifier", "classifier").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_params_exit_2_and_write_nothing(tmp_path):
    (tmp_path / "params.yaml").write_text("segmenter:\n  dept: 3\n")
    proc = subprocess.run([sys.executable, "-m", "stages.train_segmenter", "data/prepared/segmentation",
                           "models/segmenter", "reports/segmenter"], cwd=tmp_path, capture_output=True, text=True,
                          env=BARE_ENV, timeout=120)
    assert proc.returncode == 2
    assert "segmenter.dept" in proc.stderr and "did you mean 'segmenter.depth'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_a_missing_text_baseline_is_an_error_before_any_training_and_writes_nothing(workspace, capsys):
    """The baseline file is read with the prepared data: a missing one costs no training epoch."""
    from trainlab.core.errors import DataError

    with pytest.raises(DataError, match=r"nowhere/baseline\.json: missing \(run `dvc repro text_baseline`\)"):
        train_text.main(["data/prepared/text", "models/text-nb", "reports/text-nb", "--baseline",
                         "nowhere/baseline.json"])
    printed = capsys.readouterr()
    assert "epoch 1/" not in printed.out + printed.err
    assert not (workspace / "models/text-nb").exists() and not (workspace / "reports/text-nb").exists()


def test_a_run_that_cannot_open_stops_training_with_exit_6_and_writes_nothing(trained, tmp_path):
    """The MLflow run opens on a thread while training starts; if it fails (here: a deleted experiment), the stage
    stops, reports that error and writes no outputs."""
    copy = tmp_path / "deleted"
    shutil.copytree(trained / "data", copy / "data")
    shutil.copy(trained / "params.yaml", copy / "params.yaml")
    shutil.copy(trained / "mlflow.db", copy / "mlflow.db")
    uri = f"sqlite:///{copy}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.delete_experiment(client.get_experiment_by_name("trainlab").experiment_id)
    proc = subprocess.run([sys.executable, "-m", "stages.train_classifier", "data/prepared/classification",
                           "models/classifier", "reports/classifier"], cwd=copy, capture_output=True, text=True,
                          env={**BARE_ENV, "MLFLOW_TRACKING_URI": uri},
                          timeout=600)
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert "experiment 'trainlab' is deleted" in proc.stderr and "Traceback" not in proc.stderr
    assert not (copy / "models").exists() and not (copy / "reports").exists()


def test_two_trainings_with_the_same_params_in_one_folder_one_is_refused(trained, tmp_path):
    """Started together, both would write checkpoints/classifier/last.pt and resume from each other's: one trains,
    the other exits 4 at once, before any MLflow run, and writes nothing."""
    copy = tmp_path / "twice"
    shutil.copytree(trained / "data", copy / "data")
    shutil.copy(trained / "params.yaml", copy / "params.yaml")
    env = {**BARE_ENV, "MLFLOW_TRACKING_URI": f"sqlite:///{copy}/mlflow.db"}
    procs = [subprocess.Popen([sys.executable, "-m", "stages.train_classifier", "data/prepared/classification",
                               f"models/classifier_{i}", f"reports/classifier_{i}"], cwd=copy, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    results = [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]
    assert sorted(code for code, _, _ in results) == [0, 4], [err[-1000:] for _, _, err in results]
    winner, loser = sorted(range(2), key=lambda i: results[i][0])
    assert "another training of the classifier with the same params and data is running" in results[loser][2]
    assert "Traceback" not in results[loser][2]
    assert (copy / f"models/classifier_{winner}/model.safetensors").exists()
    assert not (copy / f"models/classifier_{loser}").exists() and not (copy / f"reports/classifier_{loser}").exists()
    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    assert len(client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])) == 1


def test_the_text_baseline_is_fitted_by_its_own_stage_and_read_by_the_text_training(tmp_path):
    """train_text takes the TF-IDF figures from the text_baseline stage's baseline.json instead of refitting them;
    a missing file is a clear error naming it."""
    from trainlab.core.config import Params
    from trainlab.core.errors import DataError, ParamsError
    from trainlab.data.baseline import read_baseline
    from trainlab.jobs.text_baseline import write_baseline
    from trainlab.tasks.text import text_baseline

    data = tmp_path / "text"
    data.mkdir()
    rows = [{"text": f"{'good great fine' if i % 2 else 'bad awful poor'} item {i}", "label": i % 2} for i in range(60)]
    for split, part in (("train", rows[:40]), ("test", rows[40:])):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (data / "meta.json").write_text(json.dumps({"num_classes": 2}))
    out = tmp_path / "baseline"
    written = write_baseline(Params(), data, out)
    assert written["accuracy"] == 1.0 and (out / "baseline.json").exists()
    assert text_baseline(out / "baseline.json") == read_baseline(out / "baseline.json")
    with pytest.raises(ParamsError, match="needs the text_baseline stage's baseline.json"):
        text_baseline(None)
    with pytest.raises(DataError, match=r"nothing\.json: missing"):
        read_baseline(tmp_path / "nothing.json")
    proc = subprocess.run([sys.executable, "-m", "stages.text_baseline", str(data), str(tmp_path / "again")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "again" / "baseline.json").read_text())["accuracy"] == written["accuracy"]


def test_text_bag_statistics_come_from_the_training_split_and_are_saved_with_the_model(trained):
    """train_text with text.arch tfidf_bag: the saved model holds the idf of the prepared train split (not of val)
    and the character n-grams of the prepared tokenizer's words, and the model rebuilt from its folder scores the
    test split as the training stage did."""
    from safetensors.torch import load_file

    from trainlab.core.config import TextParams
    from trainlab.data.prepared import load_split
    from trainlab.data.tokenizer import Tokenizer
    from trainlab.models.text import build_text_model

    data = trained / "data/prepared/text"
    meta = json.loads((data / "meta.json").read_text())
    splits = {s: load_split(data, s) for s in ("train", "val", "test")}
    cfg = TextParams(**{k: v for k, v in TINY["text"].items() if k in TextParams.model_fields})

    def statistics_of(split):
        model = build_text_model(cfg, meta["vocab_size"], meta["num_classes"], meta["max_length"], meta["pad_id"])
        model.fit_vocabulary(Tokenizer.load(data / "tokenizer.json").vocab)
        model.fit_idf(splits[split]["tokens"])
        return model.idf, model.char_table

    saved_tensors = load_file(str(trained / "models/text/model.safetensors"))
    idf, char_table = statistics_of("train")
    assert torch.equal(saved_tensors["idf"], idf) and torch.equal(saved_tensors["char_table"], char_table)
    assert not torch.equal(saved_tensors["idf"], statistics_of("val")[0])
    saved = load_saved_model(trained / "models/text", "text")
    with torch.no_grad():
        predicted = saved.model(splits["test"]["tokens"]).argmax(1)
    accuracy = (predicted == splits["test"]["labels"]).double().mean().item()
    assert accuracy == pytest.approx(saved.info["test"]["accuracy"], abs=1e-6)
    assert accuracy > 0.5  # 3 classes: chance is about 0.4 (the largest class)
