"""The registered MLflow model on raw inputs: loaded by name in a fresh Python process outside the repo, its
signature, example and artifacts; bad rows named; a spooled model replayed as a pyfunc, an old spool as before."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from tests.serving.workspace import tracking_uri, trained_workspace

mlflow = pytest.importorskip("mlflow")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return trained_workspace(tmp_path_factory)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINLAB_")) and k != "PYTHONPATH"}
    return {**env, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "OMP_NUM_THREADS": "1", **extra}


def test_the_champion_predicts_raw_inputs_in_a_fresh_process_outside_the_repo(root, tmp_path):
    script = textwrap.dedent('''
        import io, json, sys
        import mlflow, numpy as np, pandas as pd
        from PIL import Image

        def png(pixels):
            buffer = io.BytesIO(); Image.fromarray(pixels).save(buffer, format="PNG"); return buffer.getvalue()

        text = mlflow.pyfunc.load_model("models:/trainlab-text@champion")
        out = {"text": text.predict(pd.DataFrame({"text": ["I love this!", "what a sad day"]})).to_dict("list")}
        image = png(np.zeros((28, 28), np.uint8))
        out["classifier"] = mlflow.pyfunc.load_model("models:/trainlab-classifier@champion").predict(
            pd.DataFrame({"image": [image]})).to_dict("list")
        seg = mlflow.pyfunc.load_model("models:/trainlab-segmenter@champion").predict(
            pd.DataFrame({"image": [png(np.zeros((40, 50), np.uint8))]}))
        out["segmenter"] = {"columns": list(seg.columns), "size": Image.open(io.BytesIO(seg["mask_png"][0])).size}
        out["trainlab"] = sys.modules["trainlab"].__file__
        print(json.dumps(out))
    ''')
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=clean_env(MLFLOW_TRACKING_URI=tracking_uri(root)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(out["text"]) == ["label", "prob_negative", "prob_neutral", "prob_positive"]
    assert all(label in ("negative", "neutral", "positive") for label in out["text"]["label"])
    sums = np.array([out["text"][f"prob_{c}"] for c in ("negative", "neutral", "positive")]).sum(axis=0)
    assert sums == pytest.approx([1.0, 1.0], abs=1e-5)
    assert list(out["classifier"]) == ["label", *(f"prob_{d}" for d in range(10))]
    assert out["segmenter"]["columns"] == ["mask_png", "fraction_background", *(f"fraction_{d}" for d in range(10))]
    assert out["segmenter"]["size"] == [50, 40]  # the mask at the image's own size
    assert "/code/trainlab/" in out["trainlab"]  # trainlab came with the model, not from the checkout


def test_signature_example_artifacts_and_pinned_requirements(root, monkeypatch):
    from mlflow.models import Model

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(root))
    local = Path(mlflow.artifacts.download_artifacts("models:/trainlab-classifier@champion"))
    model = Model.load(str(local))
    assert model.signature.inputs.to_dict() == [{"type": "binary", "name": "image", "required": True}]
    assert [c["name"] for c in model.signature.outputs.to_dict()] == ["label", *(f"prob_{d}" for d in range(10))]
    example = json.loads((local / "input_example.json").read_text())
    assert example["columns"] == ["image"] and len(example["data"]) == 2
    artifacts = model.flavors["python_function"]["artifacts"]
    folder = local / artifacts["model"]["path"]
    assert {"model.safetensors", "config.json", "preprocessing.json", "info.json"} <= {p.name for p in folder.iterdir()}
    assert set(artifacts) == {"model"}  # tracking.log_tensor_model is off by default: no torch.export at the end
    assert not list(local.rglob("*.pkl"))  # models from code: no pickled model object
    requirements = (local / "requirements.txt").read_text().split()
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements or any(
        r.startswith("torch==") for r in requirements)
    assert all("==" in r for r in requirements if not r.startswith("-"))
    text = Model.load(mlflow.artifacts.download_artifacts("models:/trainlab-text@champion"))
    assert text.signature.inputs.to_dict() == [{"type": "string", "name": "text", "required": True}]


def test_bad_rows_are_named_in_one_error(root, monkeypatch):
    from mlflow.exceptions import MlflowException

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(root))
    text = mlflow.pyfunc.load_model("models:/trainlab-text@champion")
    with pytest.raises(MlflowException, match=r"2 of 3 rows rejected: row 1: empty text .*; row 2: empty text"):
        text.predict(pd.DataFrame({"text": ["fine", "   ", ""]}))
    with pytest.raises(MlflowException, match="missing inputs \\['text'\\]"):
        text.predict(pd.DataFrame({"review": ["fine"]}))
    classifier = mlflow.pyfunc.load_model("models:/trainlab-classifier@champion")
    with pytest.raises(MlflowException, match=r"1 of 2 rows rejected: row 1: unreadable or corrupt image"):
        classifier.predict(pd.DataFrame({"image": [png(np.zeros((28, 28), np.uint8)), b"not an image"]}))


def spooled_log_model(root: Path, store: Path, old_format: bool) -> tuple[str, Path]:
    """A spool holding one classifier log_model call, written as a training stage writes it with
    tracking.log_tensor_model on (old_format: as spools were written before raw-input models, without the model
    folder and raw example)."""
    from safetensors.torch import load_file

    from trainlab.serving.flavor import raw_example
    from trainlab.tasks.saved import load_saved_model
    from trainlab.tracking.queue import Call
    from trainlab.tracking.spool import RAW_EXAMPLE, SPOOLED_MODEL, write_spool

    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("trainlab", artifact_location=str(store / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    test = load_file(str(root / "data/prepared/classification/test.safetensors"))
    model = load_saved_model(root / "models" / "classifier", "classifier").model
    example = (test["images"][:2].float() / 255 - 0.5) / 0.5
    call = Call(1, "log_model", {"model": model, "name": "classifier", "input_example": example,
                                 "registered_model_name": "trainlab-classifier",
                                 "model_dir": str(root / "models" / "classifier"),
                                 "raw_example": raw_example("classifier", test, root / "data/prepared/classification"),
                                 "tensor_model": True})  # tracking.log_tensor_model: true
    folder = write_spool(store / "spool" / "train_classifier-key", {
        "stage": "train_classifier", "key": "key", "tracking_uri": uri, "run_id": run_id,
        "experiment_id": experiment, "register_models": True}, [call])
    if old_format:
        import shutil

        shutil.rmtree(folder / "files" / "1" / SPOOLED_MODEL)
        (folder / "files" / "1" / RAW_EXAMPLE).unlink()
    return uri, folder


@pytest.mark.parametrize("old_format", [False, True], ids=["spooled-now", "spooled-before-raw-inputs"])
def test_a_spooled_model_replays_raw_input_and_an_old_spool_tensor_level(root, tmp_path, monkeypatch, old_format):
    from mlflow.models import Model

    from trainlab.tracking.spool import replay

    monkeypatch.chdir(tmp_path)
    uri, folder = spooled_log_model(root, tmp_path, old_format)
    run_id, made = replay(folder)
    assert made == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    versions = client.search_model_versions(f"name = 'trainlab-classifier' AND run_id = '{run_id}'")
    assert [str(v.version) for v in versions] == ["1"]
    flavors = Model.load(mlflow.artifacts.download_artifacts("models:/trainlab-classifier/1")).flavors
    if old_format:
        assert "pytorch" in flavors and "artifacts" not in flavors["python_function"]
    else:
        artifacts = flavors["python_function"]["artifacts"]
        assert set(artifacts) == {"model", "tensor_model"}
        local = Path(mlflow.artifacts.download_artifacts("models:/trainlab-classifier/1"))
        tensor = local / artifacts["tensor_model"]["path"]
        assert "pytorch" in Model.load(str(tensor)).flavors
        assert (tensor / "data" / "model.pt2").is_file()  # the bare network, torch.export'ed, kept beside the folder
        loaded = mlflow.pyfunc.load_model("models:/trainlab-classifier/1")
        assert list(loaded.predict(pd.DataFrame({"image": [png(np.zeros((28, 28), np.uint8))]})).columns)[0] == "label"
    replay(folder)  # again: idempotent, no second version
    assert len(client.search_model_versions("name = 'trainlab-classifier'")) == 1
