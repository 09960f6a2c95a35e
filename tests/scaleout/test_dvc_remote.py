"""A DVC remote (a local folder standing in for S3): `dvc push` from one clone, `dvc pull` into a fresh one, and the
pulled stages are up to date there and their models load."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests.pipelines.conftest import REPO, commit_all, git, make_tiny_repo
from tests.scaleout.conftest import BIN, STAGE_TIMEOUT_S, files_under, stage_env, timed
from trainlab.tasks.saved import load_saved_model

STAGES = ("prepare", "train_classifier")


def dvc(args: list[str], cwd: Path) -> str:
    env = stage_env()
    env.pop("PYTHONPATH")  # the stages run from the repo they are in, not from this checkout
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=STAGE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"dvc {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


def uncached_outputs(dvc_yaml: Path, stages: tuple[str, ...]) -> list[str]:
    """The `cache: false` outs, metrics and plots of `stages`: DVC does not push them; Git has to carry them."""
    declared = yaml.safe_load(dvc_yaml.read_text())["stages"]
    found = []
    for stage in stages:
        for section in ("outs", "metrics", "plots"):
            for entry in declared[stage].get(section) or []:
                if isinstance(entry, dict):
                    found += [path for path, opts in entry.items() if (opts or {}).get("cache") is False]
    return found


def test_uncached_outputs_are_not_git_ignored():
    """`cache: false` outputs (metrics, small reports) travel in Git, so they must not be git-ignored."""
    paths = uncached_outputs(REPO / "dvc.yaml", tuple(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
    assert paths
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.split() == [], "git-ignored although DVC does not cache them"


@pytest.mark.slow
def test_push_then_pull_into_a_fresh_clone(tmp_path):
    repo = make_tiny_repo(tmp_path / "repo")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["classifier"].update(width=8)
    params["tracking"]["enabled"] = False  # MLflow is tested elsewhere; this is about DVC's cache and remote
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit_all(repo, "tiny params")

    with timed("dvc repro train_classifier (prepare + train)"):
        dvc(["repro", "train_classifier"], repo)
    git(["add", "dvc.lock"], repo)
    # `cache: false` outputs (metrics, small reports) travel in Git
    git(["add", *[p for p in uncached_outputs(repo / "dvc.yaml", STAGES) if (repo / p).exists()]], repo)
    git(["commit", "--quiet", "-m", "trained"], repo)

    remote = tmp_path / "remote"
    dvc(["remote", "add", "-d", "local", str(remote)], repo)
    commit_all(repo, "DVC remote")
    with timed("dvc push"):
        pushed = dvc(["push"], repo)
    assert "pushed" in pushed and files_under(remote), pushed

    clone = tmp_path / "clone"
    git(["clone", "--quiet", str(repo), str(clone)], tmp_path)
    assert not (clone / "models").exists() and not (clone / "data" / "prepared").exists()
    assert not (clone / ".dvc" / "cache").exists()  # its own, empty cache: whatever arrives comes from the remote
    with timed("dvc pull (fresh clone)"):
        dvc(["pull", "--with-deps", "train_classifier"], clone)
    assert dvc(["status", "--json", "--with-deps", "train_classifier"], clone).strip() == "{}"

    pulled = load_saved_model(clone / "models/classifier", "classifier")
    trained = load_saved_model(repo / "models/classifier", "classifier")
    assert pulled.info["task"] == "classifier" and pulled.config["width"] == 8
    a, b = trained.model.state_dict(), pulled.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert pulled.model(torch.rand(2, 3, 8, 8)).shape == (2, 3)
    metrics = json.loads((clone / "reports/classifier/metrics.json").read_text())
    assert metrics == json.loads((repo / "reports/classifier/metrics.json").read_text())
