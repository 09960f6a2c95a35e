"""The README's extending guide, followed literally: in a copy of the repo, its architecture module and its one table
line are added as written, and the classifier stage trains the new architecture (the guide cannot drift from the
code)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
TABLE = "trainlab/models/architectures.py"


def guide() -> tuple[str, str, str]:
    """The README's example: (the module's path, its source, the table line)."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```python\n# (trainlab/models/\w+\.py)\n(.*?)```", readme, re.S)
    line = re.search(r"`(\"\w+\": Arch\(\"trainlab\.models\.\w+\"\),)` in `CLASSIFIER_ARCHS`", readme)
    assert block and line, "README.md: the Extending section lost its example module or its table line"
    return block.group(1), block.group(2), line.group(1)


def copy_repo(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    for name in listed:
        src = REPO / name
        if src.is_file() and not name.startswith(("data/", "reports/", "models/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def add_architecture(root: Path) -> list[str]:
    """Does what the guide says; returns the files it touched."""
    path, source, line = guide()
    (root / path).write_text(source)
    table = (root / TABLE).read_text()
    opening = "CLASSIFIER_ARCHS: dict[str, Arch] = {\n"
    assert opening in table, f"{TABLE}: no CLASSIFIER_ARCHS table to add the line to"
    (root / TABLE).write_text(table.replace(opening, f"{opening}    {line}\n"))
    return [path, TABLE]


@pytest.mark.slow
def test_an_architecture_added_as_the_readme_says_trains_through_the_stage(tmp_path):
    root = tmp_path / "repo"
    copy_repo(root)
    touched = add_architecture(root)
    name = re.search(r'"(\w+)": Arch', guide()[2]).group(1)
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    assert len(touched) == 2 and not (REPO / touched[0]).exists(), changed  # one new file, one line

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["classifier"].update({"arch": name, "epochs": 2, "min_steps": None, "batch_size": 256})
    params["data"]["segmentation"].update({"canvases_per_digit": 0.05, "canvas_size": 32, "max_digits": 2})
    params["data"]["text"].update({"vocab_size": 500, "max_length": 16})
    params["tracking"]["enabled"] = False
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("MLFLOW_TRACKING_URI", None)

    def stage(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", *argv], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    stage("stages.prepare", "data/prepared", "reports/data_stats.json")
    out = stage("stages.train_classifier", "data/prepared/classification", "models/classifier", "reports/classifier")
    assert "classifier epoch 2/2" in out
    config = json.loads((root / "models/classifier/config.json").read_text())
    assert config["arch"] == name and config["task"] == "classifier"
    metrics = json.loads((root / "reports/classifier/metrics.json").read_text())
    assert metrics["test_accuracy"] > 0.5  # ten digit classes: chance is 0.1
    # the saved model rebuilds from its config.json through the same table, as evaluate and predict load it
    check = ("from trainlab.tasks.saved import load_saved_model; import torch; "
             "m = load_saved_model('models/classifier', 'classifier').model; "
             "print(type(m).__name__, m.config['arch'])")
    rebuilt = subprocess.run([sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True)
    assert rebuilt.returncode == 0 and rebuilt.stdout.split()[-1] == name, rebuilt.stderr[-2000:]


def test_the_guide_names_files_that_exist_and_a_table_line_of_their_form():
    path, source, line = guide()
    assert path.startswith("trainlab/models/") and "def build(p, num_classes: int, in_channels: int)" in source
    table = (REPO / TABLE).read_text()
    assert re.search(r'^    "resnet_small": Arch\("trainlab\.models\.resnet_small"', table, re.M), \
        "the built-in entries no longer have the form the guide's line copies"
    assert line.startswith('"') and line.endswith("),")
