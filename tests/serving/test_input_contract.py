"""One input contract from prepare to the served model: the same raw files (photos in every encoding and size,
digits as PNG/JPEG/PGM, segmentation images, a CSV with a byte-order mark, a TSV and a UTF-16 TSV, with ._ resource
forks, .DS_Store and Thumbs.db beside them) become bitwise the same model inputs through prepare's reader and writers
as through the predict command's reader and the served model's bytes; evaluate on what prepare wrote, the predict
command and the pyfunc in process then give the same outputs (the servers' answers: test_server.py, whose servers
start once)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.serving.raw_inputs import CLASSES, assert_same_as_command, raw_case, raw_values
from tests.serving.workspace import TASK_FOLDERS, tracking_uri

mlflow = pytest.importorskip("mlflow")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]
TASKS = tuple(TASK_FOLDERS)
INPUTS = {"classifier": "images", "segmenter": "images", "text": "tokens"}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return raw_case(tmp_path_factory)


def write_test_split(task: str, raw: Path, folder: Path, class_names: list[str]) -> None:
    """The test split of `folder` as prepare makes it from `raw`: its reader (index_image_folder, index_paired_folders,
    read_labeled_texts on each table the reader lists) and its writers, with the folder's input contract."""
    from trainlab.data.bad_files import BadFiles
    from trainlab.data.folders import FLAT, index_image_folder, index_paired_folders
    from trainlab.data.input_files import TABLE_SUFFIXES, list_tree
    from trainlab.data.inputs import load_contract
    from trainlab.data.texts import read_labeled_texts
    from trainlab.data.writing import write_labeled_files, write_masked_files, write_text_split

    contract = load_contract(folder)
    if task == "classifier":
        index = index_image_folder(raw)
        assert index.class_names == list(CLASSES) and len(index.skipped.hidden) == 2  # ._photo_00.jpg, .DS_Store
        labels = np.array([class_names.index(index.class_names[y]) for y in index.labels[FLAT]], dtype=np.int64)
        write_labeled_files(folder, "test", index.files[FLAT], labels, contract, BadFiles(), workers=2)
    elif task == "segmenter":
        pairs = index_paired_folders(raw, len(class_names)).pairs
        write_masked_files(folder, "test", pairs, contract, len(class_names), BadFiles(), workers=2)
    else:
        texts, labels = [], []
        for path in list_tree(raw, TABLE_SUFFIXES).files:
            labeled = read_labeled_texts(path, "text", "label", ",")
            texts += labeled.texts
            labels += [class_names.index(labeled.class_names[y]) for y in labeled.labels]
        write_text_split(folder, "test", texts, np.array(labels, dtype=np.int64), contract)


@pytest.fixture(scope="module")
def prepared(case, tmp_path_factory) -> Path:
    """A data/prepared whose test splits prepare's reader and writers made from the raw files (meta.json,
    preprocessing.json and tokenizer.json: the workspace's, which the models were trained with)."""
    root = tmp_path_factory.mktemp("contract") / "prepared"
    for task, name in TASK_FOLDERS.items():
        source, folder = case.root / "data" / "prepared" / name, root / name
        folder.mkdir(parents=True)
        for path in source.glob("*.json"):
            shutil.copy(path, folder / path.name)
        names = json.loads((folder / "preprocessing.json").read_text())["class_names"]
        write_test_split(task, case.raw[task], folder, names)
    return root


@pytest.mark.parametrize("task", TASKS)
def test_prepare_and_predict_make_bitwise_equal_model_inputs(case, prepared, task):
    from trainlab.core.config import load_params
    from trainlab.data.prepared import load_split
    from trainlab.jobs.predict import image_inputs, text_inputs
    from trainlab.serving.predictor import Predictor

    predictor = Predictor.load(case.root / "models" / task)
    if task == "text":
        inputs = text_inputs([case.given(task)], load_params(case.params), None)
    else:
        inputs = image_inputs([case.given(task)])
    assert not inputs.rejected and inputs.skipped == 3  # the ._ resource fork, .DS_Store, Thumbs.db: never read
    stored = load_split(prepared / TASK_FOLDERS[task], "test")[INPUTS[task]]
    from_files = predictor.model_inputs(inputs.items, inputs.names)
    assert from_files.x.dtype == stored.dtype and from_files.x.shape == stored.shape
    assert torch.equal(from_files.x, stored)  # prepare's bytes, in prepare's order
    served = predictor.model_inputs(raw_values(case, task), inputs.names)  # what the MLflow model gets: bytes
    assert torch.equal(served.x, stored)


def test_photos_cropped_from_jpegs_decoded_at_a_reduced_scale_are_bitwise_equal_too(case, tmp_path):
    """The classifier's policy for photos (shorter side, centre crop; JPEGs decoded at 1/2 or 1/4 scale first): the
    workspace's model with its record set to it (its pooled head takes any size)."""
    from trainlab.data.bad_files import BadFiles
    from trainlab.data.folders import FLAT, index_image_folder
    from trainlab.data.inputs import load_contract
    from trainlab.data.prepared import load_split
    from trainlab.data.preprocessing import CROP
    from trainlab.data.writing import write_labeled_files
    from trainlab.jobs.predict import image_inputs
    from trainlab.serving.predictor import Predictor

    model = tmp_path / "classifier"
    shutil.copytree(case.root / "models" / "classifier", model)
    record = json.loads((model / "preprocessing.json").read_text())
    record["image"].update(height=40, width=40, resize=CROP)
    (model / "preprocessing.json").write_text(json.dumps(record))
    index = index_image_folder(case.raw["classifier"])
    write_labeled_files(tmp_path, "test", index.files[FLAT], index.labels[FLAT], load_contract(model), BadFiles())
    inputs = image_inputs([case.given("classifier")])
    x = Predictor.load(model).model_inputs(inputs.items, inputs.names).x
    assert x.shape[1:] == (1, 40, 40) and torch.equal(x, load_split(tmp_path, "test")["images"])


@pytest.fixture(scope="module")
def evaluated(case, prepared, tmp_path_factory) -> Path:
    """reports/evaluate of the workspace's models on the prepared test splits (TTA off, as predict has none; the
    predict command's params)."""
    from trainlab.core.config import load_params
    from trainlab.jobs.evaluate import run_evaluation

    params = load_params(case.params)
    out = tmp_path_factory.mktemp("contract_eval") / "evaluate"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_evaluation(params, prepared, case.root / "models", out)
    finally:
        torch.set_num_threads(threads)
    return out


def pyfunc_records(case, task: str, monkeypatch) -> list[dict]:
    """The registered champion loaded with mlflow.pyfunc in this process, on the raw values a client sends."""
    from trainlab.serving.frames import input_column

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(case.root))
    model = mlflow.pyfunc.load_model(f"models:/trainlab-{task}@champion")
    return model.predict(pd.DataFrame({input_column(task): raw_values(case, task)})).to_dict("records")


@pytest.mark.parametrize("task", ["classifier", "text"])
def test_evaluate_the_predict_command_and_the_pyfunc_give_the_same_labels(case, evaluated, task, monkeypatch):
    with open(evaluated / f"{task}_confusion.csv", newline="") as f:
        by_evaluate = [row["predicted"] for row in csv.DictReader(f)]
    by_command = [row["label"] for row in case.rows(task)]
    assert by_command == by_evaluate
    assert_same_as_command(case, task, pyfunc_records(case, task, monkeypatch), "the pyfunc in process")


def test_evaluate_the_predict_command_and_the_pyfunc_give_the_same_masks(case, prepared, evaluated, monkeypatch):
    from trainlab.data.inputs import load_contract, resize_mask
    from trainlab.data.prepared import load_meta, load_split
    from trainlab.tasks.metrics import segmentation_metrics

    folder = prepared / "segmentation"
    policy, truth = load_contract(folder).policy, load_split(folder, "test")["masks"]
    masks = case.masks()
    assert [m.shape for m in masks][-2:] == [(40, 48), (64, 64)]  # at each image's own size
    # back at the model's size: nearest neighbour undoes an enlargement exactly
    stored = torch.stack([torch.from_numpy(resize_mask(m, policy).copy()) for m in masks]).long()
    metrics = segmentation_metrics(load_meta(folder)["num_classes"])
    metrics.update(stored, truth.long())
    reported = json.loads((evaluated / "metrics.json").read_text())["segmenter"]
    assert round(float(metrics.compute()["mean_iou"]), 6) == reported["mean_iou"]
    assert_same_as_command(case, "segmenter", pyfunc_records(case, "segmenter", monkeypatch), "the pyfunc in process")


def test_evaluate_refuses_data_prepared_another_way_than_the_model(case, prepared, tmp_path):
    from trainlab.core.errors import CheckpointError
    from trainlab.jobs.evaluate import load_inputs

    data = tmp_path / "prepared"
    shutil.copytree(prepared / "classification", data / "classification")
    record = json.loads((data / "classification" / "preprocessing.json").read_text())
    record["image"]["resize"] = "stretch"
    (data / "classification" / "preprocessing.json").write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match=r"classifier/preprocessing\.json: the model takes 1x28x28 images "
                                              r"\(resize none\), but .*prepares 1x28x28 images \(resize stretch\)"):
        load_inputs("classifier", data, case.root / "models", torch.device("cpu"))
