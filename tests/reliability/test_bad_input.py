"""Bad input is rejected: one clear message naming the file and the key or row, a non-zero exit, no traceback unless
asked for (--debug or TRAINLAB_DEBUG=1), and nothing written. The README's table of rejected inputs is backed by
these tests (tests/reliability/README_TABLE.md)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.data.factories import make_user_data, save_png, user_data_section
from tests.data.factories import write_params as write_data_params
from tests.reliability.conftest import make_workspace
from tests.reliability.factories import (
    CHECKPOINT,
    CLASSIFIER_ARGS,
    run_stage,
    tiny_params,
    tree,
    write_params,
)

pytestmark = pytest.mark.reliability


def run_in_process(main, argv: list[str], capsys) -> tuple[int, str]:
    """A stage's entry point as `python -m` runs it (run_cli); returns (exit code, stderr)."""
    from trainlab.core.cli import run_cli

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.err


# --- params ----------------------------------------------------------------------------------------------------------

BAD_PARAMS = {
    "unknown-key": ({"classifier": {"lrr": 0.1}},
                    r"classifier\.lrr \(params\.yaml:\d+\): unknown key; did you mean 'classifier\.lr'\?"),
    "wrong-type": ({"classifier": {"epochs": "many"}},
                   r"classifier\.epochs \(params\.yaml:\d+\): got 'many'; Input should be a valid integer"),
    "out-of-range": ({"classifier": {"lr": -1}},
                     r"classifier\.lr \(params\.yaml:\d+\): got -1; Input should be greater than 0"),
    "bad-choice": ({"base": {"device": "tpu"}},
                   r"base\.device \(params\.yaml:\d+\): got 'tpu'; input should be 'auto', 'cpu', 'cuda' or 'mps'"),
    "invalid-cron": ({"schedule": {"cron": "61 * * * *"}},
                     r"schedule\.cron \(params\.yaml:\d+\): got '61 \* \* \* \*'; Value error, not a valid cron"),
    "unknown-timezone": ({"schedule": {"timezone": "Mars/Olympus"}},
                         r"schedule\.timezone \(params\.yaml:\d+\): got 'Mars/Olympus'; Value error, not a known IANA"),
}


@pytest.mark.parametrize("case", list(BAD_PARAMS))
def test_bad_params_one_message_naming_file_key_and_line_exit_2_nothing_written(tmp_path, case):
    overrides, expected = BAD_PARAMS[case]
    write_params(tmp_path / "params.yaml", tiny_params(overrides))
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == "error: params.yaml: invalid params (1 problem)"
    assert re.search(expected, lines[1]), lines[1]
    assert lines[2] == "(set TRAINLAB_DEBUG=1 or pass --debug for a traceback)"
    assert tree(tmp_path) == ["params.yaml"]


def test_params_that_are_not_yaml_are_rejected(tmp_path):
    (tmp_path / "params.yaml").write_text("classifier: [unclosed\n")
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, tmp_path, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: params.yaml: not valid YAML")
    assert tree(tmp_path) == ["params.yaml"]


@pytest.mark.parametrize("how", ["--debug", "TRAINLAB_DEBUG=1"])
def test_traceback_only_when_asked_for(tmp_path, how):
    write_params(tmp_path / "params.yaml", tiny_params({"classifier": {"lrr": 0.1}}))
    args, env = (CLASSIFIER_ARGS + ["--debug"], {}) if how == "--debug" else (CLASSIFIER_ARGS, {"TRAINLAB_DEBUG": "1"})
    proc = run_stage("stages.train_classifier", args, tmp_path, timeout=120, **env)
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr and "trainlab.core.errors.ParamsError" in proc.stderr
    assert "classifier.lrr" in proc.stderr
    assert tree(tmp_path) == ["params.yaml"]


@pytest.mark.parametrize("module", ["stages.prepare", "stages.train_segmenter", "stages.train_text", "stages.evaluate"])
def test_every_stage_rejects_bad_params_the_same_way(tmp_path, monkeypatch, capsys, module):
    import importlib

    main = importlib.import_module(module).main
    write_params(tmp_path / "params.yaml", tiny_params({"base": {"seeed": 1}}))
    monkeypatch.chdir(tmp_path)
    argv = {"stages.prepare": ["data/prepared", "reports/data_stats.json"],
            "stages.evaluate": ["data/prepared", "models", "reports/evaluate"],
            "stages.train_text": ["data/prepared/x", "models/x", "reports/x",
                                  "--baseline", "models/b/baseline.json"]}.get(
        module, ["data/prepared/x", "models/x", "reports/x"])
    code, err = run_in_process(main, argv, capsys)
    assert code == 2 and "base.seeed (params.yaml:" in err and "did you mean 'base.seed'?" in err
    assert tree(tmp_path) == ["params.yaml"]


# --- prepared data read by a training stage ---------------------------------------------------------------------------

def _edit_split(split: str, edit):
    def apply(folder: Path) -> None:
        path = folder / f"{split}.safetensors"
        tensors = load_file(str(path))
        edit(tensors)
        save_file(tensors, str(path))
    return apply


def _edit_meta(**changes):
    def apply(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        meta.update(changes)
        (folder / "meta.json").write_text(json.dumps(meta))
    return apply


def _truncate(folder: Path) -> None:
    path = folder / "train.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_labels(tensors):
    tensors["labels"] = tensors["labels"][:-5]


def _bad_label(tensors):
    tensors["labels"][7] = 10


def _empty(tensors):
    for key in list(tensors):
        tensors[key] = tensors[key][:0].contiguous()


def _float_labels(tensors):
    tensors["labels"] = tensors["labels"].float()


BAD_DATA = {
    "missing": (lambda folder: shutil.rmtree(folder),
                r"classification/meta\.json: prepared metadata not found \(run `dvc repro prepare` first\)"),
    "missing-split": (lambda folder: (folder / "val.safetensors").unlink(),
                      r"classification/val\.safetensors: prepared split not found"),
    "corrupt": (lambda folder: (folder / "test.safetensors").write_bytes(b"\x00not a safetensors file" * 8),
                r"classification/test\.safetensors: not a readable safetensors file"),
    "truncated": (_truncate, r"classification/train\.safetensors: not a readable safetensors file"),
    "corrupt-meta": (lambda folder: (folder / "meta.json").write_text("{not json"),
                     r"classification/meta\.json: not valid JSON"),
    "mismatched-lengths": (_edit_split("train", _drop_labels),
                           r"classification/train\.safetensors: 3500 images but 3495 labels; they must match"),
    "label-outside-classes": (_edit_split("train", _bad_label),
                              r"classification/train\.safetensors: labels 0\.\.10 outside the 10 classes "
                              r"of .*meta\.json"),
    "meta-class-count-mismatch": (_edit_meta(num_classes=5),
                                  r"classification/train\.safetensors: labels 0\.\.9 outside the 5 classes"),
    "meta-channels-mismatch": (_edit_meta(channels=3),
                               r"classification/train\.safetensors: images \(3500, 1, 28, 28\) are not \(N, 3, H, W\)"),
    "wrong-dtype": (_edit_split("train", _float_labels), r"classification/train\.safetensors: images torch\.uint8 / "
                                                         r"labels torch\.float32"),
    "empty-split": (_edit_split("val", _empty), r"classification/val\.safetensors: the val split is empty"),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_prepared_data_exit_3_naming_the_file_nothing_written(tmp_path, prepared, monkeypatch, capsys, case):
    from stages.train_classifier import main

    break_data, expected = BAD_DATA[case]
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params())
    break_data(ws / "data/prepared/classification")
    before = tree(ws)
    monkeypatch.chdir(ws)
    code, err = run_in_process(main, CLASSIFIER_ARGS, capsys)
    assert code == 3, err
    [error] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert re.search(expected, error), error
    assert tree(ws) == before  # no model, report or checkpoint


def test_a_batch_size_larger_than_the_training_split_trains_on_all_of_it(tmp_path, prepared, monkeypatch, capsys):
    from stages.train_classifier import main

    ws = make_workspace(tmp_path / "ws", prepared, tiny_params({"classifier": {"batch_size": 4096, "max_steps": 1}}))
    monkeypatch.chdir(ws)
    main(CLASSIFIER_ARGS)  # no error
    assert "classifier.batch_size -> 3500" in capsys.readouterr().out
    info = json.loads((ws / "models/classifier/info.json").read_text())
    assert info["auto"]["batch_size"]["value"] == 3500 and "3,500 training samples" in info["auto"]["batch_size"]["why"]


# --- raw data read by prepare ---------------------------------------------------------------------------------------

def _missing_csv(root: Path, data: dict) -> str:
    (root / "texts.csv").unlink()
    return r"texts\.csv: text file not found"


def _corrupt_png(root: Path, data: dict) -> str:
    (root / "classes" / "cat" / "cat_2.png").write_bytes(b"\x89PNG but not really")
    return r"classes/cat/cat_2\.png: unreadable or corrupt image"


def _mask_mismatch(root: Path, data: dict) -> str:
    save_png(root / "seg" / "masks" / "img_01.png", np.zeros((12, 16), np.uint8))
    return r"seg/masks/img_01\.png: mask size 16x12 \(WxH\) does not match image"


def _empty_csv(root: Path, data: dict) -> str:
    (root / "texts.csv").write_text("review,sentiment\n")
    return r"texts\.csv: no data rows below the header"


def _empty_text_row(root: Path, data: dict) -> str:
    lines = (root / "texts.csv").read_text().splitlines()
    lines[3] = '"   ",good'
    (root / "texts.csv").write_text("\n".join(lines) + "\n")
    return r"texts\.csv: row 4: empty text"


BAD_RAW = {"missing": _missing_csv, "corrupt": _corrupt_png, "mismatched": _mask_mismatch, "empty": _empty_csv,
           "empty-row": _empty_text_row}


@pytest.mark.parametrize("case", list(BAD_RAW))
def test_bad_raw_data_exit_3_naming_the_file_and_row_nothing_written(tmp_path, monkeypatch, capsys, case):
    from stages.prepare import main

    raw = make_user_data(tmp_path / "raw")
    section = user_data_section(raw)
    expected = BAD_RAW[case](raw, section)
    write_data_params(tmp_path / "params.yaml", section)
    monkeypatch.chdir(tmp_path)
    code, err = run_in_process(main, ["data/prepared", "reports/data_stats.json"], capsys)
    assert code == 3
    [error] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert re.search(expected, error), error
    written = [p for p in tree(tmp_path) if not p.startswith("raw") and not (tmp_path / p).is_dir()]
    assert written == ["params.yaml"]  # (an empty data/ may be left: the parent of the staging folder)


# --- checkpoints and saved models that do not fit -------------------------------------------------------------------

@pytest.mark.parametrize("other", [{"width": 16}, {"num_classes": 5}], ids=["other-architecture", "other-class-count"])
def test_resume_checkpoint_that_does_not_fit_the_model_exit_4(tmp_path, prepared, monkeypatch, capsys, other):
    """Same params and data (so the same fingerprint) but a model that no longer fits (its code changed): a clear
    error naming the checkpoint and the mismatched keys, not a traceback from load_state_dict."""
    from stages.train_classifier import main
    from trainlab.core.config import Params
    from trainlab.engine.checkpoint import save_checkpoint
    from trainlab.jobs.train import fingerprint
    from trainlab.models.classifier import build_classifier

    params = tiny_params()
    ws = make_workspace(tmp_path / "ws", prepared, params)
    p = Params.model_validate(params)
    model = build_classifier(p.classifier.model_copy(update={"width": other.get("width", 8)}),
                             num_classes=other.get("num_classes", 10), in_channels=1)
    save_checkpoint(ws / CHECKPOINT, {"fingerprint": fingerprint(p, "classifier", ws / "data/prepared/classification"),
                                      "model": model.state_dict()})
    monkeypatch.chdir(ws)
    code, err = run_in_process(main, CLASSIFIER_ARGS, capsys)
    assert code == 4
    assert f"error: {CHECKPOINT}: does not match the model (shape mismatch " in err
    assert "another architecture or number of classes" in err and "Traceback" not in err
    assert not (ws / "models").exists()


@pytest.fixture
def saved_models(tmp_path, prepared):
    """models/{classifier,segmenter,text} as the training stages write them (untrained: only their fit matters)."""
    from trainlab.core.config import Params
    from trainlab.data.prepared import load_meta
    from trainlab.jobs.train import build_trainable, save_model

    params = Params.model_validate(tiny_params())
    data = prepared / "data" / "prepared"
    models = tmp_path / "models"
    for name, folder in {"classifier": "classification", "segmenter": "segmentation", "text": "text"}.items():
        meta = load_meta(data / folder)
        task = build_trainable(name, params, meta)
        extra_files = {"tokenizer.json": data / folder / "tokenizer.json"} if name == "text" else {}
        extra_json = {"info.json": {"task": name, "meta": meta, "run_id": ""}}
        if name == "text":
            extra_json["baseline.json"] = {"accuracy": 0.5, "macro_f1": 0.5}
        model = task.model
        if hasattr(model, "select_head"):  # text.weight_decay auto: a head per candidate; the stage saves the chosen
            model = model.select_head(0)
        save_model(model, models / name, extra_files, extra_json)
    write_params(tmp_path / "params.yaml", tiny_params())
    return models


def _other_architecture(models: Path) -> str:
    from trainlab.core.config import ClassifierParams
    from trainlab.models.classifier import build_classifier

    wider = build_classifier(ClassifierParams(width=16), num_classes=10, in_channels=1)
    save_file({k: v.contiguous() for k, v in wider.state_dict().items()}, str(models / "classifier/model.safetensors"))
    return r"models/classifier/model\.safetensors: does not match the model \(shape mismatch"


def _other_class_count(models: Path) -> str:
    from trainlab.core.config import ClassifierParams
    from trainlab.jobs.train import save_model
    from trainlab.models.classifier import build_classifier

    save_model(build_classifier(ClassifierParams(width=8), num_classes=5, in_channels=1), models / "classifier",
               extra_json={"info.json": {"task": "classifier"}})
    return r"models/classifier/config\.json: the model has num_classes=5 but .*classification/meta\.json says 10"


def _other_tokenizer(models: Path) -> str:
    path = models / "text" / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["vocab"]
    vocab[10], vocab[11] = vocab[11], vocab[10]  # same size, two words swapped: ids mean other words
    path.write_text(json.dumps(tokenizer))
    return r"models/text/tokenizer\.json: the model's vocabulary differs from .*text/tokenizer\.json"


MISFITS = {"other-architecture": _other_architecture, "other-class-count": _other_class_count,
           "tokenizer-mismatch": _other_tokenizer}


@pytest.mark.parametrize("case", list(MISFITS))
def test_model_that_does_not_fit_its_data_exit_4_nothing_written(tmp_path, prepared, saved_models, monkeypatch,
                                                                 capsys, case):
    from stages.evaluate import main

    expected = MISFITS[case](saved_models)
    monkeypatch.chdir(tmp_path)
    code, err = run_in_process(main, [str(prepared / "data/prepared"), "models", "reports/evaluate"], capsys)
    assert code == 4
    [error] = [line for line in err.splitlines() if line.startswith("error: ")]
    assert re.search(expected, error), error
    assert not (tmp_path / "reports").exists()


def test_pretrained_weights_of_another_architecture_exit_4(tmp_path, prepared, monkeypatch, capsys):
    from stages.train_classifier import main
    from trainlab.core.config import ClassifierParams
    from trainlab.models.classifier import build_classifier

    weights = tmp_path / "resnet_small.pt"
    torch.save(build_classifier(ClassifierParams(width=4), num_classes=10, in_channels=1).state_dict(), weights)
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params({"classifier": {
        "arch": "resnet18", "pretrained": str(weights)}}))
    monkeypatch.chdir(ws)
    code, err = run_in_process(main, CLASSIFIER_ARGS, capsys)
    assert code == 4
    assert re.search(r"error: .*resnet_small\.pt: does not match ResNet; missing keys", err), err
    assert not (ws / "models").exists() and not (ws / "checkpoints").exists()
