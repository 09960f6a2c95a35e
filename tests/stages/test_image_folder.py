"""A user's photo folder through the stages with the repo's default params (only source and root set): real
photos of every size and encoding prepare, train and evaluate; streamed from disk they give the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stages import prepare, train_classifier
from tests.data.factories import make_photo_folder
from trainlab.core.config import load_params
from trainlab.core.runtime import resolve_runtime
from trainlab.jobs.evaluate import load_inputs

REPO = Path(__file__).resolve().parents[2]


def default_params(**base) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"]["classification"].update(source="image_folder", root="raw")
    # the photo path as it was measured here: 64 px and params' 9 epochs (the defaults' 96 px and 480 steps would
    # give these 120 small crops 480 epochs of one step: minutes, see the quality suite for the defaults themselves)
    params["data"]["classification"]["image_size"] = 64
    params["classifier"]["min_steps"] = None
    params["tracking"]["enabled"] = False
    params["base"].update(base)
    return params


def train(root: Path, name: str, **base) -> dict:
    (root / "params.yaml").write_text(yaml.safe_dump(default_params(**base)))
    train_classifier.main(["data/prepared/classification", f"models/{name}", f"reports/{name}",
                           "--params", str(root / "params.yaml")])
    return {"metrics": json.loads((root / "reports" / name / "metrics.json").read_text()),
            "history": (root / "reports" / name / "history.csv").read_text()}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """scikit-learn's two photos cut into 60 crops each of every size and encoding, prepared with the defaults."""
    root = tmp_path_factory.mktemp("photos")
    make_photo_folder(root / "raw", per_class=60, seed=1)
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    (root / "params.yaml").write_text(yaml.safe_dump(default_params()))
    prepare.main(["data/prepared", "reports/data_stats.json", "--params", str(root / "params.yaml")])
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def in_memory(photos):
    return train(photos, "classifier")


def test_photos_train_from_scratch_to_70_percent(photos, in_memory):
    stats = json.loads((photos / "reports" / "data_stats.json").read_text())["classification"]
    assert stats["height"] == stats["width"] == 64 and stats["files"]["image_files"] == 120
    assert in_memory["metrics"]["test_accuracy"] >= 0.7


def test_streamed_from_disk_trains_bitwise_like_in_memory(photos, in_memory):
    streamed = train(photos, "streamed", data_on_device_max_mb=0, num_workers=2)
    assert streamed == in_memory


def test_evaluation_streams_the_test_split_with_the_same_result(photos, in_memory):
    params = load_params(photos / "params.yaml")
    runtime = resolve_runtime(params.base)
    reports = []
    for limit in (None, 0):
        inputs = load_inputs("classifier", photos / "data" / "prepared", photos / "models", runtime.device, limit)
        reports.append(inputs.code.evaluate(inputs, runtime, params).metrics)
    assert reports[0] == reports[1] and reports[0]["test_samples"] == 24
