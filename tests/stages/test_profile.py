"""The profile stage on tiny trained models: its files, its MLflow run and the sanity of its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from trainlab.core.config import ClassifierParams, SegmenterParams, TextParams
from trainlab.data.prepared import save_meta, save_split
from trainlab.jobs.train import save_model
from trainlab.models.classifier import build_classifier
from trainlab.models.segmenter import build_segmenter
from trainlab.models.text import build_text_model

REPO = Path(__file__).resolve().parents[2]
TASKS = ("classifier", "segmenter", "text")
PROFILE = {"batch_size": 8, "warmup_steps": 1, "steps": 2, "repeats": 2, "compile": False, "trace": True}


def make_workspace(root):
    """data/prepared/{classification,segmentation,text} and models/{classifier,segmenter,text}, all tiny."""
    g = torch.Generator().manual_seed(0)
    data, models = root / "data" / "prepared", root / "models"
    n = 12
    cls = data / "classification"
    for split in ("train", "val", "test"):
        save_split(cls, split, {"images": torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g),
                                "labels": torch.randint(0, 10, (n,), generator=g)})
    save_meta(cls, {"num_classes": 10, "channels": 1, "height": 28, "width": 28,
                    "class_names": [str(i) for i in range(10)]})
    seg = data / "segmentation"
    for split in ("train", "val", "test"):
        save_split(seg, split, {"images": torch.randint(0, 256, (n, 1, 32, 32), dtype=torch.uint8, generator=g),
                                "masks": torch.randint(0, 3, (n, 32, 32), dtype=torch.uint8, generator=g)})
    save_meta(seg, {"num_classes": 3, "channels": 1, "height": 32, "width": 32,
                    "class_names": ["background", "a", "b"]})
    txt = data / "text"
    for split in ("train", "val", "test"):
        save_split(txt, split, {"tokens": torch.randint(1, 50, (n, 12), generator=g),
                                "labels": torch.randint(0, 2, (n,), generator=g)})
    save_meta(txt, {"num_classes": 2, "vocab_size": 50, "max_length": 12, "pad_id": 0,
                    "class_names": ["neg", "pos"]})
    built = {
        "classifier": build_classifier(ClassifierParams(width=8), num_classes=10, in_channels=1),
        "segmenter": build_segmenter(SegmenterParams(base_channels=4, depth=2), num_classes=3, in_channels=1),
        "text": build_text_model(TextParams(arch="transformer", d_model=16, n_heads=2, n_layers=1, dim_feedforward=32),
                                 vocab_size=50, num_classes=2, max_length=12),
    }
    for name, model in built.items():
        save_model(model, models / name, extra_json={"info.json": {"task": name}})
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump({"profile": PROFILE, "tracking": {"experiment": "profile-test"}}))
    return data, models, params


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Run `python -m stages.profile` (in process) once for the module; cwd and MLflow in a tmp folder."""
    from stages.profile import main

    root = tmp_path_factory.mktemp("profile")
    data, models, params = make_workspace(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        main([str(data), str(models), "reports/profile", "--params", str(params)])
    return root, root / "reports" / "profile"


def test_writes_every_output(profiled):
    _, out = profiled
    expected = {"metrics.json", "measurements.json", "report.md", "throughput.png"}
    expected |= {f"trace_{t}.json" for t in TASKS} | {f"top_ops_{t}.txt" for t in TASKS}
    assert expected <= {p.name for p in out.iterdir()}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "temp files left behind"
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    for task in TASKS:
        assert f"## {task}" in report
    assert "MFU" in report
    for task in TASKS:
        trace = json.loads((out / f"trace_{task}.json").read_text())
        assert trace["traceEvents"], task
        top = (out / f"top_ops_{task}.txt").read_text()
        assert "Top 15 operators by self CPU time" in top and "aten::" in top


def test_dvc_metrics_are_the_headline_figures(profiled):
    _, out = profiled
    metrics = json.loads((out / "metrics.json").read_text())
    measured = json.loads((out / "measurements.json").read_text())
    assert set(metrics) == {"best_train_samples_per_s"}  # a few columns in `dvc exp show`, not the matrix
    assert metrics["best_train_samples_per_s"] == {
        task: max(m["train_samples_per_s"] for m in measured[task].values()) for task in TASKS}


def test_metrics_are_sane(profiled):
    _, out = profiled
    metrics = json.loads((out / "measurements.json").read_text())
    assert metrics["device"]["matmul_peak_fp32_gflop_per_s"] > 0
    assert metrics["stage_seconds"] > 0
    from trainlab.core.config import BaseParams
    from trainlab.core.runtime import resolve_runtime

    used = resolve_runtime(BaseParams()).precision  # what base.precision auto trains with on this machine
    for task in TASKS:
        settings = metrics[task]
        # profile.settings "used" (the default): the training stages' setting and the plain fp32 baseline
        assert set(settings) == ({"fp32", used} if task == "text" else {"fp32", f"{used}_channels_last"}), task
        for name, m in settings.items():
            where = f"{task}/{name}"
            assert m["train_samples_per_s"] > 0 and m["infer_samples_per_s"] > 0, where
            assert 0 < m["train_mfu"] <= 1.5 and 0 < m["infer_mfu"] <= 1.5, where
            assert m["train_achieved_gflop_per_s"] > 0, where
            assert m["train_peak_memory_mb"] > 0 and m["infer_peak_memory_mb"] > 0, where
            # forward + backward is about 3 forwards (a bit less: no input gradient for the first layer)
            assert 1.5 < m["train_gflop_per_step"] / m["infer_gflop_per_step"] < 4.5, where
            # achieved FLOP/s is FLOPs per step x steps per second
            steps_per_s = m["train_samples_per_s"] / PROFILE["batch_size"]
            assert m["train_achieved_gflop_per_s"] == pytest.approx(m["train_gflop_per_step"] * steps_per_s,
                                                                     rel=0.01), where


def test_logs_a_profile_run_to_mlflow(profiled):
    import mlflow

    root, out = profiled
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name("profile-test")
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'profile'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["classifier/fp32/train_mfu"] > 0
    assert run.data.params["profile.steps"] == "2"
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "profile")}
    assert {f"profile/{p.name}" for p in out.iterdir()} <= logged


def test_missing_model_is_a_clear_error(tmp_path, tmp_mlflow, capsys):
    from stages.profile import main
    from trainlab.core.cli import run_cli

    data, models, params = make_workspace(tmp_path)
    (models / "text" / "model.safetensors").unlink()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, [str(data), str(models), str(tmp_path / "out"), "--params", str(params), "--tasks", "text"])
    assert exit_info.value.code == 4
    assert "model.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_params_fail_fast_without_torch(tmp_path, capsys):
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_text("profile:\n  steps: 0\n")
    code = ("import sys; from stages.profile import main; from trainlab.core.cli import run_cli\n"
            "try:\n    run_cli(main)\nfinally:\n    assert 'torch' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code, "d", "m", "o", "--params", str(tmp_path / "params.yaml")],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "profile.steps" in result.stderr and "Traceback" not in result.stderr
