"""One tiny trained workspace for the predict and serving tests: the embedded data prepared small, the three models
trained a few steps with MLflow tracking (SQLite in tmp; each model's first registered version is its `champion`),
evaluated with TTA off. Built once per session, whichever test module asks first."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

TASK_FOLDERS = {"classifier": "classification", "segmenter": "segmentation", "text": "text"}
TINY = {
    "base": {"seed": 3, "precision": "fp32", "num_workers": 0},
    "data": {"segmentation": {"canvases_per_digit": 0.06, "canvas_size": 32, "max_digits": 2},
             "text": {"vocab_size": 2000, "max_length": 32}},
    "classifier": {"width": 8, "epochs": 1, "max_steps": 12, "batch_size": 64, "lr": 0.01, "warmup_epochs": 0.0},
    "segmenter": {"base_channels": 4, "depth": 1, "epochs": 1, "max_steps": 2, "batch_size": 8, "warmup_epochs": 0.0},
    "text": {"epochs": 1, "max_steps": 3, "batch_size": 256, "warmup_epochs": 0.0, "baseline_max_features": 500,
             "buckets": 4096, "char_buckets": 4096},
    "evaluate": {"batch_size": 64, "tta": False, "n_examples": 2},
    "tracking": {"enabled": True},
}
_BUILT: dict[str, Path] = {}


def tracking_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def trained_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tmp/{params.yaml, data/prepared, models/<task>, reports/evaluate, mlflow.db, mlartifacts} (made once)."""
    if "root" in _BUILT:
        return _BUILT["root"]
    import mlflow
    import torch

    from pipelines.compare import champion_version
    from stages import evaluate, prepare, text_baseline, train_classifier, train_segmenter, train_text

    stages = {"classifier": train_classifier, "segmenter": train_segmenter, "text": train_text}
    root = tmp_path_factory.mktemp("serving")
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("MLFLOW_TRACKING_URI", tracking_uri(root))
        torch.set_num_threads(1)
        try:
            prepare.main(["data/prepared", "reports/data_stats.json"])
            text_baseline.main(["data/prepared/text", "models/text_baseline"])
            for name, stage in stages.items():
                options = ["--baseline", "models/text_baseline/baseline.json"] if name == "text" else []
                stage.main([f"data/prepared/{TASK_FOLDERS[name]}", f"models/{name}", f"reports/{name}", *options])
            evaluate.main(["data/prepared", "models", "reports/evaluate"])
        finally:
            torch.set_num_threads(threads)
        client = mlflow.MlflowClient(tracking_uri=tracking_uri(root))
        for name in stages:  # registering a model's first version made it the champion
            assert str(champion_version(client, name).version) == "1", f"trainlab-{name} v1 is not the champion"
    _BUILT["root"] = root
    return root
