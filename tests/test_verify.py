"""python -m trainlab.verify on a tiny classifier: identical on the machine that trained it (a fixed number of epochs,
or epochs auto's plateau schedule); an injected nondeterminism found at its epoch and, with --bisect, at its step; a
killed and resumed run keeps the same trail; a faked ISA record named in the verdict."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.reliability.factories import (
    BIN,
    CHECKPOINT,
    CLASSIFIER_ARGS,
    mid_epoch_checkpoint,
    run_env,
    run_stage,
    start,
    stop_group,
    tiny_params,
    wait_until,
    write_params,
)
from trainlab.engine.trail import PERTURB_ENV

# About 27 optimizer steps an epoch, 3 epochs, a checkpoint every 5 steps (so a kill lands between two).
PARAMS = {"classifier": {"batch_size": 128, "epochs": 3, "min_steps": None, "checkpoint_every_steps": 5}}
# epochs auto: the plateau schedule from a lower bound of about 2 epochs, a cooldown after 1 validation of no progress
PLATEAU = {"classifier": {"batch_size": 128, "epochs": "auto", "min_steps": 60, "patience": 1,
                          "checkpoint_every_steps": 5}}
PYTHON = str(BIN / "python")
REPO = Path(__file__).resolve().parents[1]


def train_once(root: Path, params: dict) -> Path:
    """Prepared data and the classifier trained once (a stage subprocess, tracking off)."""
    from stages.prepare import main as prepare

    write_params(root / "params.yaml", tiny_params(params))
    prepare([str(root / "data" / "prepared"), str(root / "reports" / "data_stats.json"), "--params",
             str(root / "params.yaml")])
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train_once(tmp_path_factory.mktemp("verify"), PARAMS)


def record(root: Path) -> dict:
    return json.loads((root / "reports" / "classifier" / "run.json").read_text())


def verify(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "trainlab.verify", *args], cwd=root, capture_output=True, text=True,
                          env=run_env(**env), timeout=900, stdin=subprocess.DEVNULL)


def test_the_run_records_a_fingerprint_and_a_trail(trained):
    run = record(trained)
    assert run["fingerprint"]["cpu_isa"] and run["fingerprint"]["threads"] == "1"
    assert run["fingerprint"]["precision"] == "fp32" and len(run["fingerprint"]["data_hash"]) == 16
    trail = run["trail"]
    assert [e["epoch"] for e in trail["epochs"]] == [1, 2, 3]
    assert [s["step"] for s in trail["steps"]] == list(range(trail["every"], trail["epochs"][-1]["step"] + 1,
                                                             trail["every"]))
    assert run["rerun"]["task"] == "classifier" and Path(run["rerun"]["data_dir"]).is_absolute()


def test_a_run_verified_on_the_machine_that_trained_it_is_identical(trained):
    proc = verify(trained, "models/classifier")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL to the bit: 3 epochs" in proc.stdout and "model.safetensors md5 equal" in proc.stdout
    assert "s in the original run" in proc.stdout


def test_an_injected_nondeterminism_is_found_at_its_epoch_and_with_bisect_at_its_step(trained, tmp_path):
    """Every run perturbs the gradients of optimizer step N by a random amount (as a nondeterministic kernel would):
    verify names N's epoch and the first recorded step at or after N; --bisect names N itself."""
    per_epoch = record(trained)["trail"]["epochs"][0]["step"]
    n = per_epoch + 7  # in epoch 2, between two recorded steps
    root = tmp_path / "perturbed"
    shutil.copytree(trained, root, ignore=shutil.ignore_patterns("models", "reports"))
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root, **{PERTURB_ENV: str(n)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    every = record(root)["trail"]["every"]
    assert n % every

    proc = verify(root, "models/classifier", "--bisect", **{PERTURB_ENV: str(n)})
    out = proc.stdout
    assert proc.returncode == 10, out + proc.stderr
    assert "first epoch that differs: 2 " in out
    assert f"first recorded step that differs: optimizer step {(n // every + 1) * every} " in out
    assert "the fingerprints agree" in out
    assert f"the replays part at optimizer step {n} (grad_norm" in out


def test_a_killed_and_resumed_run_has_the_same_trail_as_an_uninterrupted_one(trained, tmp_path):
    root = tmp_path / "killed"
    shutil.copytree(trained, root, ignore=shutil.ignore_patterns("models", "reports"))
    proc = start([PYTHON, "-m", "stages.train_classifier", *CLASSIFIER_ARGS], root, root / "killed.log")
    try:
        state = wait_until(mid_epoch_checkpoint(root / CHECKPOINT, min_epoch=1), proc, root / "killed.log",
                           what="a mid-epoch checkpoint")
    finally:
        stop_group(proc, signal.SIGKILL)
    assert state["trail"]["steps"] and state["trail"]["epochs"][0]["epoch"] == 1
    resumed = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stdout[-2000:] + resumed.stderr
    ours, theirs = record(root)["trail"], record(trained)["trail"]
    assert ours["steps"] == theirs["steps"] and ours["epochs"] == theirs["epochs"]


def test_a_fingerprint_difference_is_named_in_the_verdict(trained, tmp_path):
    """A record from another CPU kind (its ISA and its numbers faked): the verdict names the ISA of each."""
    root = tmp_path / "other-cpu"
    for folder in ("models", "reports"):
        shutil.copytree(trained / folder, root / folder)
    run = record(root)
    here = run["fingerprint"]["cpu_isa"]
    faked = "AMX" if here == "AVX-512 BF16" else "AVX-512 BF16"
    run["fingerprint"]["cpu_isa"] = run["trail"]["fingerprint"]["cpu_isa"] = faked
    run["trail"]["steps"][0]["loss_sum"] += 1e-4
    run["trail"]["epochs"][0]["weights"] = "0" * 16
    (root / "reports" / "classifier" / "run.json").write_text(json.dumps(run))
    proc = verify(root, "models/classifier", "--epochs", "1")
    assert proc.returncode == 10, proc.stdout + proc.stderr
    assert "first epoch that differs: 1 (weights hashes)" in proc.stdout
    assert f"first recorded step that differs: optimizer step {run['trail']['every']} " in proc.stdout
    assert f"CPU ISA: {here} here, {faked} recorded: vectorised fp32 kernels differ" in proc.stdout


def test_missing_data_is_could_not_rerun(trained, tmp_path):
    root = tmp_path / "no-data"
    for folder in ("models", "reports"):
        shutil.copytree(trained / folder, root / folder)
    run = record(root)
    run["rerun"]["data_dir"] = str(tmp_path / "gone")
    (root / "reports" / "classifier" / "run.json").write_text(json.dumps(run))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = verify(root, "models/classifier", TMPDIR=str(scratch))
    assert proc.returncode == 11, proc.stdout + proc.stderr
    assert f"{tmp_path / 'gone'}: the run's prepared data folder is missing here" in proc.stderr
    assert not list(scratch.iterdir()), "an empty workspace was left behind"


def test_a_target_that_is_no_run_is_a_clear_error_and_leaves_no_workspace(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = verify(tmp_path, "models/nothing-here", TMPDIR=str(scratch))
    assert proc.returncode not in (0, 10) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "models/nothing-here" in proc.stderr, proc.stderr
    assert not list(scratch.iterdir())



def test_a_tracked_run_is_verified_by_its_mlflow_run_and_by_its_stage_name(trained, tmp_path):
    """Tracking on: the run's MLflow tags carry the fingerprint and its trail.json the trail, so a model folder
    without run.json is found through MLflow, by `runs:/<id>` and by the dvc.yaml stage that trains it."""
    import mlflow

    root = tmp_path / "tracked"
    shutil.copytree(trained / "data", root / "data")
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    write_params(root / "params.yaml", tiny_params(PARAMS, {"tracking": {"enabled": True, "uri": uri,
                                                                          "register_models": False}}))
    proc = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    client = mlflow.MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               filter_string="tags.stage = 'train_classifier'")
    assert run.data.tags["fingerprint.cpu_isa"] == record(root)["fingerprint"]["cpu_isa"]
    assert "trail.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    (root / "reports" / "classifier" / "run.json").unlink()  # only MLflow knows the run now

    for target in (f"runs:/{run.info.run_id}", "train_classifier"):
        proc = verify(root, target, "--epochs", "1", MLFLOW_TRACKING_URI=uri)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"(runs:/{run.info.run_id})" in proc.stdout and "IDENTICAL to the bit: 1 epoch" in proc.stdout


def cache_object(root: Path, md5: str, text: str) -> None:
    """A file in root's DVC cache as DVC 3 stores it (files/md5/<2>/<rest>)."""
    path = root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("model_known", [True, False], ids=["model-folder-known", "only-the-file-known"])
def test_lock_explains_a_training_stages_differing_file_by_the_fingerprint_of_its_run(tmp_path, model_known):
    """A training stage's history.csv that differs on another machine gets the machine's verdict (it once crashed:
    the CSV's cache object was read as a folder manifest)."""
    from trainlab.verify.lock import lock_verdict

    root, repo = tmp_path / "committed", tmp_path / "fresh"
    weights, folder, history = "a" * 32, "b" * 32 + ".dir", "c" * 32
    cache_object(root, folder, json.dumps([{"md5": weights, "relpath": "model.safetensors"}]))
    cache_object(root, history, "epoch,step,val_accuracy\n1,5,0.5\n")
    for where, threads in ((root, "2"), (repo, "1")):
        (where / "reports" / "classifier").mkdir(parents=True)
        (where / "reports" / "classifier" / "run.json").write_text(json.dumps(
            {"fingerprint": {"threads": threads, "torch": "2.14.1"}, "model_md5": weights}))
    machine: dict[str, list[str]] = {}
    verdict = lock_verdict(root, repo, "train_classifier", "reports/classifier/history.csv", history, "d" * 32,
                           machine, **({"model_md5": folder} if model_known else {}))
    assert verdict.startswith("differs as expected for another machine: ") and "threads" in verdict, verdict
    assert list(machine) == ["train_classifier"]


def test_a_run_stopped_on_its_plateau_resumes_after_kill_9_to_the_same_bits_and_verifies_identical(tmp_path_factory):
    trained = train_once(tmp_path_factory.mktemp("verify-plateau"), PLATEAU)
    stopping = json.loads((trained / "models" / "classifier" / "info.json").read_text())["stopping"]
    epochs = stopping["stopped_epoch"]
    assert 2 <= epochs < 100 and "cooldown" in stopping["why"]  # stopped on its plateau, far below the ceiling
    proc = verify(trained, "models/classifier")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"IDENTICAL to the bit: {epochs} epochs" in proc.stdout and "model.safetensors md5 equal" in proc.stdout

    root = tmp_path_factory.mktemp("verify-plateau-killed")
    shutil.copytree(trained, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("models", "reports"))
    proc = start([PYTHON, "-m", "stages.train_classifier", *CLASSIFIER_ARGS], root, root / "killed.log")
    try:
        wait_until(mid_epoch_checkpoint(root / CHECKPOINT, min_epoch=1), proc, root / "killed.log",
                   what="a mid-epoch checkpoint")
    finally:
        stop_group(proc, signal.SIGKILL)
    resumed = run_stage("stages.train_classifier", CLASSIFIER_ARGS, root)
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stdout[-2000:] + resumed.stderr
    ours, theirs = record(root)["trail"], record(trained)["trail"]
    assert ours["steps"] == theirs["steps"] and ours["epochs"] == theirs["epochs"]
    assert json.loads((root / "models" / "classifier" / "info.json").read_text())["stopping"] == stopping
    weights = [(r / "models" / "classifier" / "model.safetensors").read_bytes() for r in (root, trained)]
    assert weights[0] == weights[1]
