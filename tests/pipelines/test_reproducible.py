"""What git and dvc.lock track is reproducible, and DVC's run-cache restores every stage but profile: real `dvc repro`
of the tiny pipeline in fresh clones of the repo the pipeline flow ran in, with each clone's own MLflow store."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from benchmarks.processes import run_env
from tests.pipelines.conftest import BIN, GIT_IDENTITY, commit_all, git
from trainlab.tracking.lineage import file_md5

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

RESTORABLE = ("prepare", "train_classifier", "train_segmenter", "train_text", "evaluate")


def repro(root: Path, *args: str) -> str:
    """`dvc repro ARGS` in `root` as a user runs it: MLflow in the repo's own mlflow.db, no flow around it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "TRAINLAB_PARENT_RUN_ID", "DVC_EXP_NAME")}
    env.update({**GIT_IDENTITY, "DVC_NO_ANALYTICS": "1", "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    proc = subprocess.run([str(BIN / "dvc"), "repro", *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"dvc repro {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def changed_files(root: Path) -> list[str]:
    return sorted(line[3:] for line in git(["status", "--porcelain", "--untracked-files=all"], root).splitlines())


def runs_by_stage(root: Path) -> dict[str, int]:
    import mlflow

    if not (root / "mlflow.db").exists():
        return {}
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainlab")
    counts: dict[str, int] = {}
    for run in client.search_runs([experiment.experiment_id], max_results=1000):
        counts[run.data.tags.get("stage", "")] = counts.get(run.data.tags.get("stage", ""), 0) + 1
    return counts


def run_states(root: Path) -> dict[str, str]:
    """{run name: its git_dirty tag} of the runs in the repo's own MLflow store."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainlab")
    return {run.info.run_name: run.data.tags.get("git_dirty", "") for run in
            client.search_runs([experiment.experiment_id], max_results=1000)}


def clone(src: Path, dst: Path) -> Path:
    git(["clone", "--quiet", str(src), str(dst)], src.parent)
    return dst


@pytest.fixture(scope="module")
def committed(first_pipeline_run, tiny_repo, tmp_path_factory) -> Path:
    """A copy of the tiny repo after its pipeline run (the flow's `dvc repro`: every stage ran), with dvc.lock and
    the reports committed as the project commits them. Copied, so these tests' commits and param edits stay here."""
    root = tmp_path_factory.mktemp("repro") / "repo"
    shutil.copytree(tiny_repo, root, symlinks=True, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts"))
    commit_all(root, "dvc.lock and reports")  # its own MLflow store from here on
    assert changed_files(root) == []
    return root


def test_a_fresh_clone_reproduces_every_tracked_file_but_the_profile(committed, tmp_path):
    fresh = clone(committed, tmp_path / "fresh")
    output = repro(fresh)  # its own empty DVC cache: every stage runs
    assert all(f"Running stage '{stage}'" in output for stage in RESTORABLE)

    changed = changed_files(fresh)
    assert [f for f in changed if f != "dvc.lock" and not f.startswith("reports/profile/")] == [], changed
    old = yaml.safe_load(git(["show", "HEAD:dvc.lock"], fresh))["stages"]
    new = yaml.safe_load((fresh / "dvc.lock").read_text())["stages"]
    assert {name for name in old if old[name] != new[name]} <= {"profile"}
    assert all(not (fresh / "reports" / task / "timing.json").exists() for task in ("classifier", "text"))
    assert (fresh / "reports/classifier/run.json").exists()  # timings and the run id: here, git-ignored
    # DVC deleted each stage's committed reports before running it: no run counts that as uncommitted code
    dirty = {name: flag for name, flag in run_states(fresh).items() if flag != "false"}
    assert len(run_states(fresh)) >= len(RESTORABLE) and not dirty, dirty


def test_verify_lock_finds_every_output_but_the_profiles_identical_to_the_committed_dvc_lock(committed):
    """`python -m trainlab.verify --lock` reproduces the pipeline in a copy of the repo (without the venv on PATH: its
    stages still run in the venv) and compares each output with the committed dvc.lock."""
    env = run_env(PATH="/usr/bin:/bin")
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the threads the flow's stages ran with (one under xdist)
        env.pop(key) if key not in os.environ else env.update({key: os.environ[key]})
    proc = subprocess.run([str(BIN / "python"), "-m", "trainlab.verify", "--lock"], cwd=committed, capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")]
    verdicts = {(cells[0], cells[1]): " ".join(cells[2:]) for cells in lines}
    assert verdicts[("train_classifier", "models/classifier")] == "identical"
    assert verdicts[("evaluate", "reports/evaluate/metrics.json")] == "identical"
    assert verdicts[("profile", "reports/profile/measurements.json")].startswith("timing-only")
    assert "0 differ unexpectedly" in proc.stdout
    assert changed_files(committed) == []  # the copy's run left the repo as it was


def test_the_run_cache_restores_every_stage_but_profile_without_running_it(committed, tmp_path):
    shared = clone(committed, tmp_path / "shared")
    cache = committed / ".dvc" / "cache"
    subprocess.run([str(BIN / "dvc"), "config", "--local", "cache.dir", str(cache)], cwd=shared, check=True,
                   capture_output=True)
    output = repro(shared)

    for stage in RESTORABLE:
        assert f"Stage '{stage}' is cached - skipping run, checking out outputs" in output, output[-3000:]
    assert "Running stage 'profile'" in output
    assert runs_by_stage(shared) == {"profile": 1}  # a restored stage runs no code: no MLflow run
    assert file_md5(shared / "models/classifier/model.safetensors") == file_md5(
        committed / "models/classifier/model.safetensors")
    assert [f for f in changed_files(shared) if f != "dvc.lock" and not f.startswith("reports/profile/")] == []


def test_changed_params_then_changed_back_restore_the_trained_model(committed):
    params_file = committed / "params.yaml"
    original = params_file.read_text()
    model = committed / "models/classifier/model.safetensors"
    trained_md5, runs_before = file_md5(model), runs_by_stage(committed).get("train_classifier", 0)
    params = yaml.safe_load(original)
    params["classifier"]["lr"] = params["classifier"]["lr"] * 3
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        assert "Running stage 'train_classifier'" in repro(committed, "train_classifier")
        assert file_md5(model) != trained_md5
    finally:
        params_file.write_text(original)
    output = repro(committed, "train_classifier")

    assert "Stage 'train_classifier' is cached - skipping run, checking out outputs" in output
    assert runs_by_stage(committed)["train_classifier"] == runs_before + 1  # only the run with the changed lr
    assert file_md5(model) == trained_md5
    assert changed_files(committed) == []  # metrics.json, history.csv and dvc.lock are back as committed
